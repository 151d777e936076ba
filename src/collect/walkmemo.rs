//! The walks of the directories named to a long-lived engine (`top DIR`, `serve DIR`,
//! `record DIR`), kept between snapshots while no directory below changed.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::sample::Warning;

/// A directory's identity and last change: (device, inode, mtime s, mtime ns).
type Stamp = (u64, u64, i64, i64);

/// A directory walk ([`super::walk::files`]) and the stamps of every directory it went
/// through. A file created, removed or renamed in any of them moves that directory's
/// mtime, so while every stamp holds the walk would list the same files: it is reused for
/// the cache's maximum age. What a stamp cannot show (a file growing in place past the
/// size of interest; its new size is read with its residency anyway) shows within that
/// age. A directory changed within the last second is not trusted (its mtime has the
/// clock's coarse granularity: two changes in one tick leave one mtime), so such a walk is
/// done again next time.
struct Walked {
    at: Instant,
    dirs: Vec<(PathBuf, Stamp)>,
    files: Vec<(PathBuf, std::fs::Metadata)>,
    warnings: Vec<Warning>,
}

/// The kept walks, by the directory named; none for a one-shot gather (a zero age).
#[derive(Default)]
pub struct WalkMemo {
    walks: HashMap<PathBuf, Walked>,
    max_age: Duration,
}

/// Changes within this long of the walk are not trusted to have moved the mtime.
const SETTLE: Duration = Duration::from_secs(1);

fn stamp(m: &std::fs::Metadata) -> Stamp {
    (m.dev(), m.ino(), m.mtime(), m.mtime_nsec())
}

impl WalkMemo {
    pub fn new(max_age: Duration) -> Self {
        WalkMemo {
            walks: HashMap::new(),
            max_age,
        }
    }

    /// The regular files below `dir` with their metadata, and the warnings of the walk:
    /// the kept walk while every directory it went through is unchanged, else a new one.
    pub fn files(
        &mut self,
        dir: &Path,
        warnings: &mut Vec<Warning>,
    ) -> anyhow::Result<Vec<(PathBuf, std::fs::Metadata)>> {
        // Every `stat` and the walk on a helper thread under the deadline
        // ([`super::answer`]): a directory on a mount that does not answer fails in one.
        let place = super::answer::Place::of(dir);
        if let Some(w) = self.walks.get(dir) {
            let fresh = w.at.elapsed() < self.max_age;
            let dirs = w.dirs.clone();
            let unchanged = move || {
                dirs.iter().enumerate().all(|(i, (d, s))| {
                    // The directory named is followed when it is a link, as the walk does.
                    let m = if i == 0 {
                        std::fs::metadata(d)
                    } else {
                        std::fs::symlink_metadata(d)
                    };
                    m.is_ok_and(|m| m.is_dir() && stamp(&m) == *s)
                })
            };
            if fresh && super::answer::within(place.clone(), dir, unchanged)? {
                warnings.extend(w.warnings.iter().cloned());
                return Ok(w.files.clone());
            }
        }
        self.walks.remove(dir);
        let d = dir.to_path_buf();
        let ((files, dirs), own) = super::answer::within(place, dir, move || {
            let mut own = Vec::new();
            super::walk::files_and_dirs(&d, &mut own).map(|r| (r, own))
        })??;
        warnings.extend(own.iter().cloned());
        let settled = SystemTime::now() - SETTLE;
        let trusted = dirs
            .iter()
            .all(|(_, m)| m.modified().is_ok_and(|t| t < settled));
        if !self.max_age.is_zero() && trusted {
            let dirs = dirs.iter().map(|(p, m)| (p.clone(), stamp(m))).collect();
            self.walks.insert(
                dir.to_path_buf(),
                Walked {
                    at: Instant::now(),
                    dirs,
                    files: files.clone(),
                    warnings: own,
                },
            );
        }
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn names(files: &[(PathBuf, std::fs::Metadata)]) -> Vec<String> {
        files
            .iter()
            .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    }

    /// Sets a directory's mtime 10 s back, as if its last change had settled.
    fn settle(dir: &Path) {
        let t = SystemTime::now() - Duration::from_secs(10);
        std::fs::File::open(dir)
            .unwrap()
            .set_times(std::fs::FileTimes::new().set_modified(t))
            .unwrap();
    }

    #[test]
    fn a_walk_is_kept_while_its_directories_hold_and_done_again_when_one_changes() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("a.gguf"), b"x").unwrap();
        std::fs::write(d.path().join("sub/b.gguf"), b"x").unwrap();
        settle(d.path());
        settle(&d.path().join("sub"));
        let mut memo = WalkMemo::new(Duration::from_secs(60));
        let mut w = Vec::new();
        assert_eq!(
            names(&memo.files(d.path(), &mut w).unwrap()),
            ["a.gguf", "b.gguf"]
        );
        assert!(memo.walks.contains_key(d.path()), "a settled walk is kept");
        // A file added below (its directory's mtime moves): walked again at once.
        std::fs::write(d.path().join("sub/c.gguf"), b"x").unwrap();
        assert_eq!(
            names(&memo.files(d.path(), &mut w).unwrap()),
            ["a.gguf", "b.gguf", "c.gguf"]
        );
        // Just changed: not trusted, so not kept; a removal is seen at the next snapshot.
        assert!(!memo.walks.contains_key(d.path()));
        std::fs::remove_file(d.path().join("a.gguf")).unwrap();
        assert_eq!(
            names(&memo.files(d.path(), &mut w).unwrap()),
            ["b.gguf", "c.gguf"]
        );
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn a_one_shot_gather_keeps_nothing_and_an_old_walk_is_done_again() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a.gguf"), b"x").unwrap();
        settle(d.path());
        let mut none = WalkMemo::default();
        none.files(d.path(), &mut Vec::new()).unwrap();
        assert!(none.walks.is_empty());
        let mut memo = WalkMemo::new(Duration::from_millis(1));
        memo.files(d.path(), &mut Vec::new()).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        // Aged: walked again (and kept anew).
        let before = memo.walks[d.path()].at;
        memo.files(d.path(), &mut Vec::new()).unwrap();
        assert!(memo.walks[d.path()].at > before);
    }
}

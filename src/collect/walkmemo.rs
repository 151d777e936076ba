//! The walks of the directories named to a long-lived engine (`top DIR`, `serve DIR`,
//! `record DIR`), kept between snapshots while no directory below changed; and the files
//! named one by one (`serve --model-glob`'s matches), known without a `stat` of their path
//! while the directory holding them did not change.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use super::answer::Place;
use crate::sample::{FileKey, Warning};

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

/// A file named by itself, and the stamp of its directory read before its `stat`.
struct Named {
    at: Instant,
    dir: Stamp,
    place: Place,
    key: FileKey,
}

/// The kept walks, by the directory named; none for a one-shot gather (a zero age).
#[derive(Default)]
pub struct WalkMemo {
    walks: HashMap<PathBuf, Walked>,
    max_age: Duration,
    /// The files named one by one, by the path named ([`WalkMemo::named`]).
    named: HashMap<PathBuf, Named>,
    /// The stamp of each directory of a file named, as this gather read it.
    dirs_now: HashMap<PathBuf, Option<Stamp>>,
    /// This process's `mountinfo`, polled at each gather: a mount made or undone since (a
    /// bind mount over a file or a directory moves no mtime) forgets everything kept.
    mountinfo: Option<std::fs::File>,
}

/// Changes within this long of the walk are not trusted to have moved the mtime.
const SETTLE: Duration = Duration::from_secs(1);

fn stamp(m: &std::fs::Metadata) -> Stamp {
    (m.dev(), m.ino(), m.mtime(), m.mtime_nsec())
}

impl WalkMemo {
    pub fn new(max_age: Duration) -> Self {
        WalkMemo {
            max_age,
            ..WalkMemo::default()
        }
    }

    /// Starts a gather: directories are read again, and if any mount was made or undone
    /// since the last gather, nothing kept is trusted.
    pub fn begin(&mut self) {
        self.dirs_now.clear();
        if !self.max_age.is_zero() && mounts_moved(&mut self.mountinfo) {
            self.walks.clear();
            self.named.clear();
        }
    }

    /// The metadata of `path`, a file named by itself and kept ([`WalkMemo::keep_named`]),
    /// without a `stat` of its path: while the directory holding it is as it was before
    /// that `stat` (no name in it created, removed or renamed, no mount made or undone),
    /// the name names the same inode, and an `fstat` of the descriptor `open` gives for
    /// that inode is its metadata now (a size grown in place included). `None`: not kept,
    /// aged, its directory changed, or no such descriptor; its path is `stat`ed, after
    /// this call has read its directory's stamp.
    pub fn named(
        &mut self,
        path: &Path,
        open: impl FnOnce(FileKey) -> Option<std::sync::Arc<std::fs::File>>,
    ) -> Option<(Place, std::fs::Metadata)> {
        if self.max_age.is_zero() {
            return None;
        }
        let now = self.dir_stamp(&dir_of(path));
        let k = self.named.get(path)?;
        if k.at.elapsed() >= self.max_age || now != Some(k.dir) {
            self.named.remove(path);
            return None;
        }
        let meta = open(k.key)?.metadata().ok()?;
        (meta.is_file() && FileKey::from_dev(meta.dev(), meta.ino()) == k.key)
            .then(|| (k.place.clone(), meta))
    }

    /// Keeps `path`, a regular file (not a link) whose `stat` gave `meta`, while its
    /// directory's stamp read by [`WalkMemo::named`] before that `stat` holds and had
    /// settled.
    pub fn keep_named(&mut self, path: &Path, place: Place, meta: &std::fs::Metadata) {
        let Some(Some(dir)) = self.dirs_now.get(&dir_of(path)).copied() else {
            return;
        };
        let settled = SystemTime::now() - SETTLE;
        let mtime = SystemTime::UNIX_EPOCH + Duration::new(dir.2.max(0) as u64, dir.3 as u32);
        if self.max_age.is_zero() || !meta.is_file() || mtime >= settled {
            return;
        }
        // A link's target is in another directory, whose changes this one's stamp misses.
        let p = path.to_path_buf();
        let link = super::answer::within(place.clone(), path, move || {
            std::fs::symlink_metadata(&p).map_or(true, |m| m.file_type().is_symlink())
        });
        if link.unwrap_or(true) {
            return;
        }
        let key = FileKey::from_dev(meta.dev(), meta.ino());
        let at = Instant::now();
        self.named.insert(
            path.to_path_buf(),
            Named {
                at,
                dir,
                place,
                key,
            },
        );
    }

    /// The stamp of directory `dir` (`None`: not a directory, or not answering), read
    /// once a gather under the deadline ([`super::answer`]).
    fn dir_stamp(&mut self, dir: &Path) -> Option<Stamp> {
        if let Some(s) = self.dirs_now.get(dir) {
            return *s;
        }
        let m = super::answer::metadata(Place::of(dir), dir)
            .ok()
            .and_then(|m| m.ok());
        let s = m.filter(|m| m.is_dir()).map(|m| stamp(&m));
        self.dirs_now.insert(dir.to_path_buf(), s);
        s
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

/// The directory holding `path` (`.` for a bare name).
fn dir_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Whether a mount was made or undone in this thread's mount namespace since the last
/// call (`mountinfo` polls with `POLLPRI` once per change); the first call, or one that
/// cannot tell, says yes.
fn mounts_moved(kept: &mut Option<std::fs::File>) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let Some(f) = kept.as_ref() else {
        *kept = std::fs::File::open("/proc/thread-self/mountinfo").ok();
        return true;
    };
    let mut fds = [PollFd::new(f.as_fd(), PollFlags::POLLPRI)];
    !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(0))
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

    /// Runs `f` on a thread of its own mount namespace, private: no mount made elsewhere
    /// shows in it, and none made in it shows elsewhere.
    fn in_own_mounts<T: Send>(f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: unshare changes only this thread's namespaces.
                let rc = unsafe { libc::unshare(libc::CLONE_NEWNS) };
                assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
                let private = std::process::Command::new("mount")
                    .args(["--make-rprivate", "/"])
                    .status();
                assert!(private.unwrap().success());
                f()
            })
            .join()
            .unwrap()
        })
    }

    /// The kept descriptor of `path`'s inode, as a long-lived engine holds it.
    fn opener(path: &Path) -> impl Fn(FileKey) -> Option<std::sync::Arc<std::fs::File>> + '_ {
        move |k| {
            let f = std::fs::File::open(path).ok()?;
            let m = f.metadata().ok()?;
            (FileKey::from_dev(m.dev(), m.ino()) == k).then(|| std::sync::Arc::new(f))
        }
    }

    /// One gather's look at a named file: the kept metadata, else its `stat` (kept).
    fn look(memo: &mut WalkMemo, path: &Path, held: &std::fs::File) -> (bool, u64) {
        memo.begin();
        let held = std::sync::Arc::new(held.try_clone().unwrap());
        if let Some((_, m)) = memo.named(path, |_| Some(held)) {
            return (true, m.len());
        }
        let m = std::fs::metadata(path).unwrap();
        memo.keep_named(path, Place::of(path), &m);
        (false, m.len())
    }

    #[test]
    fn a_named_file_is_fstated_while_its_directory_holds_and_stated_again_when_it_changes() {
        in_own_mounts(named_file_while_its_directory_holds);
    }

    fn named_file_while_its_directory_holds() {
        use std::io::Write;
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a.gguf");
        std::fs::write(&a, b"xy").unwrap();
        settle(d.path());
        let held = std::fs::File::open(&a).unwrap();
        let mut memo = WalkMemo::new(Duration::from_secs(60));
        assert_eq!(look(&mut memo, &a, &held), (false, 2), "first: stat");
        assert_eq!(
            look(&mut memo, &a, &held),
            (true, 2),
            "then the descriptor's fstat"
        );
        // Grown in place (no name in the directory moved): its size now, from the fstat.
        let mut w = std::fs::OpenOptions::new().append(true).open(&a).unwrap();
        w.write_all(b"zzz").unwrap();
        assert_eq!(look(&mut memo, &a, &held), (true, 5));
        // Another file renamed over it: the directory's mtime moved, its path is stated.
        let b = d.path().join("b.gguf");
        std::fs::write(&b, b"0123456789").unwrap();
        std::fs::rename(&b, &a).unwrap();
        assert_eq!(look(&mut memo, &a, &held), (false, 10));
        // Just changed: not kept until the directory settles.
        assert_eq!(look(&mut memo, &a, &held), (false, 10));
        // A descriptor of another inode is not taken for it.
        settle(d.path());
        let now = std::fs::File::open(&a).unwrap();
        assert_eq!(look(&mut memo, &a, &now), (false, 10));
        assert_eq!(memo.named(&a, opener(&a)).map(|(_, m)| m.len()), Some(10));
        assert_eq!(memo.named(&a, |_| None).map(|(_, m)| m.len()), None);
        // A one-shot gather keeps nothing; a link is never kept (its target's directory
        // is another).
        let mut none = WalkMemo::default();
        assert_eq!(look(&mut none, &a, &now), (false, 10));
        assert_eq!(look(&mut none, &a, &now), (false, 10));
        let l = d.path().join("l.gguf");
        std::os::unix::fs::symlink(&a, &l).unwrap();
        settle(d.path());
        assert_eq!(look(&mut memo, &l, &now), (false, 10));
        assert_eq!(look(&mut memo, &l, &now), (false, 10));
    }

    #[test]
    fn a_mount_over_a_named_file_forgets_what_was_kept() {
        in_own_mounts(mount_over_a_named_file);
    }

    fn mount_over_a_named_file() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a.gguf");
        let other = d.path().join("other");
        std::fs::write(&a, b"xy").unwrap();
        std::fs::write(&other, b"0123").unwrap();
        settle(d.path());
        let held = std::fs::File::open(&a).unwrap();
        let mut memo = WalkMemo::new(Duration::from_secs(60));
        memo.begin();
        memo.files(d.path(), &mut Vec::new()).unwrap();
        look(&mut memo, &a, &held);
        assert_eq!(look(&mut memo, &a, &held), (true, 2));
        assert!(memo.walks.contains_key(d.path()));
        // A bind mount over the file moves no mtime of its directory.
        let mount = std::process::Command::new("mount")
            .arg("--bind")
            .args([&other, &a])
            .status()
            .unwrap();
        assert!(mount.success(), "bind mount (the suite runs as root)");
        let seen = look(&mut memo, &a, &held);
        let walked = memo.walks.contains_key(d.path());
        let umount = std::process::Command::new("umount").arg(&a).status();
        assert!(umount.unwrap().success());
        assert_eq!(seen, (false, 4), "the mounted file, by its path");
        assert!(!walked, "the walks are forgotten too");
    }
}

//! Model files kept open between a live view's snapshots (`top`, `record`, `serve`): each
//! snapshot reads a kept file's residency through the descriptor it opened before, where
//! it would otherwise `statfs` a way to it (not on FUSE), open it, `fstat` and close it
//! again. On `bench/host.sh` (205 model files, one snapshot a second) those calls were 6%
//! of `top`'s CPU.
//!
//! Only files on a filesystem of this machine's disks or memory ([`super::answer`]'s
//! local ones) are kept: an open descriptor on NFS would make an unlink there a
//! `.nfsXXXX` rename, and a file on FUSE is never opened at all. A descriptor is the inode
//! it was opened on, so what it measures stays that file whatever its path names since
//! (which is read by a `stat` of the path, as before).
//!
//! What keeping costs the host: a file deleted while it is kept stays allocated (its
//! blocks, or its pages on tmpfs) until the next snapshot, whose `fstat` sees no link
//! left and closes it (a snapshot that sees it unlinked never keeps it). A file that
//! leaves the files of interest is closed at that snapshot. At most
//! [`HeldFiles::budget`] descriptors are kept.

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bpf::tasks::HeldPages;
use crate::sample::{FileKey, ResidencySample};

/// The residency `cachestat` gave a kept file, with the page count the task_file iterator
/// gave it just before ([`super::bpf::tasks::TaskIter::held_pages`]) and its [`Stamp`].
/// While all of these stand, the file's page count (`cachestat`'s `nr_cache` is the
/// mapping's `nrpages`) has not moved and nothing wrote it, so the sample stands too: no
/// `cachestat`, which walks every page of the file (about 0.1 ms for 1 GiB here). Its
/// evicted and recently evicted counts, which move with no page of the file moving, are
/// read again after [`RECOUNT_AFTER`]; a file with dirty or writeback pages is read at
/// every snapshot.
#[derive(Debug, Clone)]
pub struct Since {
    pub stamp: Stamp,
    pub nrpages: u64,
    pub sample: ResidencySample,
    pub at: Instant,
}

/// How long a kept file's residency stands while its page count and stamp do.
pub const RECOUNT_AFTER: Duration = Duration::from_secs(10);

impl Since {
    /// Whether the sample stands now for a file of stamp `stamp` with `nrpages` pages.
    pub fn stands(&self, stamp: Stamp, nrpages: u64) -> bool {
        let clean = self.sample.dirty_bytes == Some(0) && self.sample.writeback_bytes == Some(0);
        clean && self.stamp == stamp && self.nrpages == nrpages && self.at.elapsed() < RECOUNT_AFTER
    }
}

/// What the iterator says of a kept file now: its page count, and what stood before.
#[derive(Debug, Clone)]
pub struct PagesNow {
    pub nrpages: u64,
    pub since: Option<Since>,
}

/// A measured file's `fstat`: its size and its last modification and change times (ns).
/// The same for every way to one inode: what the twins' fingerprints are kept by.
pub type Stamp = (u64, i128, i128);

/// The [`Stamp`] of an `fstat`.
pub fn stamp(st: &nix::sys::stat::FileStat) -> Stamp {
    let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
    (
        st.st_size as u64,
        ns(st.st_mtime, st.st_mtime_nsec),
        ns(st.st_ctime, st.st_ctime_nsec),
    )
}

/// What a snapshot measured of a file ([`super::measure::file_sample`]), for
/// [`HeldFiles::measured`].
#[derive(Default)]
pub struct Opened {
    pub stamp: Option<Stamp>,
    pub file: Option<Arc<File>>,
    pub since: Option<Since>,
    /// How long its residency read took (`None`: none was read, or it stood).
    pub took: Option<Duration>,
}

/// The files kept open, and the stamps of every file measured at the last snapshot.
pub struct HeldFiles {
    open: HashMap<FileKey, Arc<File>>,
    stamps: HashMap<FileKey, Stamp>,
    budget: usize,
    /// This snapshot's page counts of the descriptors kept (`None`: no iterator).
    pages: Option<HeldPages>,
    since: HashMap<FileKey, Since>,
    /// Residencies this snapshot took from [`Since`] (no `cachestat`).
    pub stood: usize,
    /// What the last read of the iterator took (it visits every descriptor of this
    /// process, not only these), and what `cachestat` of the files whose residency could
    /// stand on it (clean, its page count as `cachestat` counted) took at their last read:
    /// what reading it saves ([`HeldFiles::want_pages`]).
    iter_took: Option<Duration>,
    saves: Duration,
    /// This snapshot's sum for `saves`, where it reads the iterator.
    saving: Option<Duration>,
    /// What each kept file's last `cachestat` took.
    took: HashMap<FileKey, Duration>,
    /// Snapshots since the iterator was last read.
    unread: u32,
    /// Read the iterator at every snapshot, whatever it costs (tests).
    pub always_pages: bool,
}

/// While `cachestat` is the cheaper, the iterator is read once in this many snapshots
/// (how many descriptors it would visit changes).
const PROBE_EVERY: u32 = 16;

impl Default for HeldFiles {
    fn default() -> Self {
        HeldFiles::new(Self::budget())
    }
}

impl HeldFiles {
    /// Descriptors kept at most: a sixteenth of the soft `RLIMIT_NOFILE` (`statm`, `io`
    /// and the proof's indexes take the rest but a sixteenth).
    pub fn budget() -> usize {
        super::statfiles::soft_limit() / 16
    }

    pub fn new(budget: usize) -> Self {
        HeldFiles {
            open: HashMap::new(),
            stamps: HashMap::new(),
            budget,
            pages: None,
            since: HashMap::new(),
            stood: 0,
            iter_took: None,
            saves: Duration::ZERO,
            saving: None,
            took: HashMap::new(),
            unread: 0,
            always_pages: false,
        }
    }

    /// Whether to read the kept descriptors' page counts this snapshot: where the
    /// iterator's last read (a walk of every descriptor of this process) took less than
    /// the `cachestat` calls it spared (few files of many pages: a 20 GiB model's takes
    /// about 2 ms), both as measured, and once in [`PROBE_EVERY`] snapshots to measure
    /// them again. A process that holds many more descriptors than model files (statm of
    /// each process, the proof's indexes) with small files reads `cachestat`.
    pub fn want_pages(&mut self) -> bool {
        let want = self.iter_took.is_none_or(|t| t < self.saves);
        self.unread += 1;
        if want || self.always_pages || self.unread >= PROBE_EVERY {
            self.unread = 0;
            return true;
        }
        false
    }

    /// What the iterator read of `key`'s kept descriptor this snapshot, if anything.
    pub fn pages(&self, key: FileKey) -> Option<PagesNow> {
        use std::os::fd::AsRawFd;
        let fd = self.open.get(&key)?.as_raw_fd();
        let &(ino, nrpages) = self.pages.as_ref()?.get(&fd)?;
        (ino == key.inode).then(|| PagesNow {
            nrpages,
            since: self.since.get(&key).cloned(),
        })
    }

    /// The descriptor kept for `key`, if any.
    pub fn get(&self, key: FileKey) -> Option<Arc<File>> {
        self.open.get(&key).cloned()
    }

    /// Starts a snapshot: the stamps are this snapshot's only; `pages`, the kept
    /// descriptors' page counts read now, in `took`.
    pub fn begin(&mut self, pages: Option<HeldPages>, took: Duration) {
        self.stamps.clear();
        // With no file kept yet (the first snapshot), nothing can stand on it: not
        // measured, so read again at the next.
        let judged = pages.is_some() && !self.open.is_empty();
        self.saving = judged.then_some(Duration::ZERO);
        if judged {
            self.iter_took = Some(took);
        }
        self.pages = pages;
        self.stood = 0;
    }

    /// What this snapshot measured of `key` ([`Opened`]): its stamp, the
    /// descriptor to keep (`None`: closed, or not kept), its residency with the page count
    /// it stands on, and what its `cachestat` took. A descriptor is kept within the budget
    /// only.
    pub fn measured(&mut self, key: FileKey, o: Opened) {
        if let Some(s) = o.stamp {
            self.stamps.insert(key, s);
        }
        if let Some(t) = o.took {
            self.took.insert(key, t);
        }
        match o.since {
            Some(s) => {
                self.stood += usize::from(self.since.get(&key).is_some_and(|o| o.at == s.at));
                if let Some(sum) = self.saving.as_mut() {
                    *sum += self.took.get(&key).copied().unwrap_or_default();
                }
                self.since.insert(key, s);
            }
            None => {
                self.since.remove(&key);
            }
        }
        match o.file {
            Some(f) if self.open.contains_key(&key) || self.open.len() < self.budget => {
                self.open.insert(key, f);
            }
            _ => {
                self.open.remove(&key);
            }
        }
    }

    /// Closes the descriptors of files this snapshot did not measure.
    pub fn end(&mut self) {
        let stamps = &self.stamps;
        self.open.retain(|k, _| stamps.contains_key(k));
        let open = &self.open;
        self.since.retain(|k, _| open.contains_key(k));
        self.took.retain(|k, _| open.contains_key(k));
        self.pages = None;
        if let Some(sum) = self.saving.take() {
            self.saves = sum;
        }
    }

    /// The stamp this snapshot measured of `key`.
    pub fn stamp(&self, key: FileKey) -> Option<Stamp> {
        self.stamps.get(&key).copied()
    }

    /// Descriptors kept now.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_micros(n * 100)
    }

    /// One snapshot measuring `files` (key inode, `cachestat` time, whether its residency
    /// could stand on the page count), reading the iterator (in `iter`) or not.
    fn snapshot(h: &mut HeldFiles, iter: Option<Duration>, files: &[(u64, Duration, bool)]) {
        let pages = iter.map(|_| HeldPages::default());
        h.begin(pages, iter.unwrap_or_default());
        for &(ino, took, stands) in files {
            let since = stands.then(|| Since {
                stamp: (0, 0, 0),
                nrpages: 0,
                sample: ResidencySample::default(),
                at: Instant::now(),
            });
            let o = Opened {
                stamp: Some((0, 0, 0)),
                since,
                took: Some(took),
                file: Some(Arc::new(File::open("/dev/null").unwrap())),
            };
            h.measured(FileKey::from_dev(1, ino), o);
        }
        h.end();
    }

    #[test]
    fn the_page_counts_are_read_where_they_spare_more_cachestat_than_they_cost() {
        // Not read yet, or read with no file kept (the first snapshot): read, to measure.
        let mut h = HeldFiles::new(256);
        assert!(h.want_pages());
        // The bench host: the iterator walks 2,030 descriptors (0.8 ms) to spare 205
        // files' `cachestat` (0.6 ms): probed once in 16 snapshots.
        let small: Vec<(u64, Duration, bool)> = (0..205).map(|i| (i, ms(6) / 205, true)).collect();
        snapshot(&mut h, Some(ms(8)), &small);
        assert!(h.want_pages());
        snapshot(&mut h, Some(ms(8)), &small);
        let read: Vec<bool> = (0..PROBE_EVERY * 2).map(|_| h.want_pages()).collect();
        assert_eq!(read.iter().filter(|r| **r).count(), 2, "probed once in 16");
        assert!(read[PROBE_EVERY as usize - 1]);
        // A serving host: three 20 GiB models (2 ms each) for 300 descriptors (0.1 ms).
        let big = [(1, ms(20), true), (2, ms(20), true), (3, ms(20), true)];
        let mut h = HeldFiles::new(16);
        snapshot(&mut h, Some(ms(1)), &big);
        snapshot(&mut h, Some(ms(1)), &big);
        assert!((0..4).all(|_| h.want_pages()));
        // Their page counts move at every snapshot: nothing could stand, nothing spared.
        let moving = [(1, ms(20), false), (2, ms(20), false), (3, ms(20), false)];
        snapshot(&mut h, Some(ms(1)), &moving);
        assert!(!h.want_pages());
        // A snapshot that did not read it leaves what it measured as it was.
        snapshot(&mut h, None, &big);
        assert!(!h.want_pages());
        snapshot(&mut h, Some(ms(1)), &big);
        assert!(h.want_pages());
    }
}

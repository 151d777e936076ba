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
    /// Descriptors of this process at the last read of the iterator, which visits each.
    fds_seen: Option<usize>,
    /// Files measured, and their cached pages, at the last snapshot: what `cachestat`
    /// of them all costs ([`HeldFiles::want_pages`]).
    measured_files: (usize, u64),
    counting: (usize, u64),
    /// Snapshots since the iterator was last read.
    unread: u32,
    /// Read the iterator at every snapshot, whatever it costs (tests).
    pub always_pages: bool,
}

/// What the task_file iterator costs per descriptor of this process, and `cachestat` per
/// call and per cached page (ns; measured on this 2-core VM, Linux 6.18: 0.8 ms for 2,030
/// descriptors; 90–150 µs for a cached 1 GiB file, about 1 µs for a small one).
const ITER_NS_PER_FD: u64 = 400;
const CACHESTAT_NS_PER_CALL: u64 = 1000;
const CACHESTAT_PAGES_PER_US: u64 = 2500;
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
            fds_seen: None,
            measured_files: (0, 0),
            counting: (0, 0),
            unread: 0,
            always_pages: false,
        }
    }

    /// Whether to read the kept descriptors' page counts this snapshot: where the
    /// iterator's walk of every descriptor of this process costs less than `cachestat` of
    /// the files kept (few files of many pages: a 20 GiB model's `cachestat` takes about
    /// 2 ms), and once in [`PROBE_EVERY`] snapshots to learn how many descriptors it
    /// would walk. A process that holds many more descriptors than model files (statm of
    /// each process, the proof's indexes) with small files reads `cachestat`.
    pub fn want_pages(&mut self) -> bool {
        let (files, pages) = self.measured_files;
        let want = self.fds_seen.is_none_or(|fds| {
            let stat_ns =
                files as u64 * CACHESTAT_NS_PER_CALL + pages * 1000 / CACHESTAT_PAGES_PER_US;
            fds as u64 * ITER_NS_PER_FD < stat_ns
        });
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
    /// descriptors' page counts read now.
    pub fn begin(&mut self, pages: Option<HeldPages>) {
        self.stamps.clear();
        if let Some(p) = &pages {
            self.fds_seen = Some(p.len());
        }
        self.pages = pages;
        self.stood = 0;
        self.counting = (0, 0);
    }

    /// What this snapshot measured of `key`: its stamp, and the descriptor to keep
    /// (`None`: closed, or not kept); its residency with the page count it stands on.
    /// A descriptor is kept within the budget only.
    pub fn measured(
        &mut self,
        key: FileKey,
        stamp: Option<Stamp>,
        file: Option<Arc<File>>,
        since: Option<Since>,
        cached_bytes: Option<u64>,
    ) {
        if let Some(s) = stamp {
            self.stamps.insert(key, s);
        }
        if file.is_some() {
            let ps = super::system::page_size().max(1);
            self.counting.0 += 1;
            self.counting.1 += cached_bytes.unwrap_or(0) / ps;
        }
        match since {
            Some(s) => {
                self.stood += usize::from(self.since.get(&key).is_some_and(|o| o.at == s.at));
                self.since.insert(key, s);
            }
            None => {
                self.since.remove(&key);
            }
        }
        match file {
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
        self.pages = None;
        self.measured_files = self.counting;
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

    fn held(fds: usize, files: usize, pages: u64) -> HeldFiles {
        let mut h = HeldFiles::new(16);
        h.fds_seen = Some(fds);
        h.measured_files = (files, pages);
        h
    }

    #[test]
    fn the_page_counts_are_read_where_cheaper_than_cachestat_and_probed_else() {
        // The bench host: 2,030 descriptors, 205 files of 1.28 M pages in all.
        let mut h = held(2030, 205, 1_280_000);
        let read: Vec<bool> = (0..PROBE_EVERY * 2).map(|_| h.want_pages()).collect();
        assert_eq!(read.iter().filter(|r| **r).count(), 2, "probed once in 16");
        assert!(read[PROBE_EVERY as usize - 1]);
        // A serving host: 300 descriptors, three 20 GiB models whole in the page cache.
        let mut h = held(300, 3, 3 * 5_242_880);
        assert!((0..4).all(|_| h.want_pages()));
        // Not read yet: read, to learn the count.
        assert!(HeldFiles::new(16).want_pages());
    }
}

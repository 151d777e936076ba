//! What a long-lived engine (`top`, `serve`, `record`) keeps between snapshots, so that a
//! snapshot of an unchanged process costs one small read instead of four and a page-table
//! walk.
//!
//! Every snapshot reads `/proc/PID/stat` of every process: its start time (field 22, with
//! the pid it names one process), `minflt` and `majflt` (fields 10 and 12: any page
//! mapped by a fault), `vsize` (field 23: any `mmap`, `munmap`, `mremap`, `brk`), `rss`
//! (field 24: the sum of `RssAnon`, `RssFile` and `RssShmem`, so any reclaim, swap-out or
//! page mapped by another process's access), the name (field 2) and the parent (field 4).
//! What else is kept per process is read again:
//!
//! - `status` and `maps` when any of those changed (an `munmap` and an `mmap` of the same
//!   size leave `vsize` alone, not the faults that map the new pages);
//! - `fd/*` and `cmdline` (with `maps`, phase 1 of [`super::gather`]) when the process is
//!   new, its pid names another process, its name changed (an `exec`), or `vsize` changed
//!   and with it the number of open descriptors (the size `stat` gives `/proc/PID/fd`,
//!   Linux 6.2+; always where that reads 0) or the command line (an `exec` that keeps
//!   the name): a busy server with a thousand sockets whose heap moves every second is
//!   not listed fd by fd every snapshot;
//! - `smaps` or `smaps_rollup`, and `cgroup` (phase 3) when any of those changed, when
//!   another process mapping one of the same files of interest changed, appeared or
//!   exited (per-file PSS depends on who else maps the pages), or when a child or the
//!   parent of the process appeared or exited (`fork` turns private pages into shared
//!   ones without changing the parent's counters);
//! - `io` (`rchar`) of a process that maps and holds no file of interest and is no
//!   candidate, only when any of those changed (a candidate's is read every snapshot: it
//!   is in its proof's fingerprint);
//! - all of it when the entry is older than its maximum age (between half of
//!   [`MAX_AGE`] and all of it, spread by pid so that re-reads do not all fall on one
//!   snapshot); such a refresh, when `stat` has not changed, keeps phase 3 (read again
//!   after [`DETAIL_AGE_FACTOR`] times the maximum age) and does not make the other
//!   mappers of its files read again (nothing moved their PSS).
//!
//! What no counter shows, and only the maximum age bounds: a newly opened (not mapped) fd,
//! an `mprotect` or an `mremap` that moves a mapping (addresses and permissions in `maps`)
//! or a mapping that replaces another of the same size, before any page is touched, a
//! `setuid`, a move to another cgroup, a changed command line, and the whole-process PSS/USS shift when an unrelated process
//! maps or unmaps a shared library. A one-shot `scan` keeps no cache and reads everything.
//!
//! Kernel documentation: <https://www.kernel.org/doc/html/latest/filesystems/proc.html>
//! (table 1-4, "Contents of the stat fields").

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::process::{FdTarget, StatusRead};
pub use super::statfiles::StatStamp;
use crate::sample::{CgroupRef, FileKey, MappingSample, RollupSample};

/// An entry is read again after this long, whatever its counters say (a safety net).
pub const MAX_AGE: Duration = Duration::from_secs(120);

/// Phase 3 (`smaps`: a walk of the page tables, the costliest read) of an unchanged
/// process is read again after this many times its maximum age: what it shows that no
/// counter does is only the whole-process PSS/USS drift when unrelated processes map or
/// unmap shared libraries (the PSS of files of interest moves only with their mappers'
/// counters, which are watched).
pub const DETAIL_AGE_FACTOR: u32 = 3;

/// What phase 1 read of a process besides `status`.
#[derive(Debug, Default)]
pub struct BasicParts {
    pub maps: Vec<MappingSample>,
    pub fds: Vec<FdTarget>,
    pub cmdline: Vec<String>,
    /// Model files its command line names, resolved when the command line was read.
    pub named: Vec<NamedFile>,
    pub denied: bool,
    /// Open descriptors when `fds` was read: the size `stat` gives `/proc/PID/fd`
    /// (Linux 6.2 and later; `None` where it reads 0).
    pub fd_count: Option<u64>,
    /// Its mappings by file, worked out once per version of the parts (an unchanged
    /// process keeps its parts, so a live view does not go over its mappings again).
    pub by_file: std::sync::OnceLock<super::mapped::MappedFiles>,
}

impl BasicParts {
    /// The files it maps ([`super::mapped::MappedFiles`]).
    pub fn mapped_files(&self) -> &super::mapped::MappedFiles {
        self.by_file
            .get_or_init(|| super::mapped::MappedFiles::of(&self.maps))
    }
}

/// An existing regular file with a model extension that a process's command line names
/// (`llama-server -m /models/x.gguf`), resolved in the process's root and working
/// directory.
#[derive(Debug, Clone)]
pub struct NamedFile {
    /// The path as the process names it (absolute).
    pub shown: PathBuf,
    /// Where twofold opens it (`/proc/PID/root/...`).
    pub open_path: PathBuf,
    pub key: FileKey,
    pub size_bytes: u64,
}

/// What phase 3 read of a process, for one set of wanted files.
#[derive(Debug, Clone)]
pub struct Detail {
    pub wanted: HashSet<FileKey>,
    pub mappings: Vec<MappingSample>,
    pub rollup: Option<RollupSample>,
    pub cmdline: Vec<String>,
    pub cgroup: Option<CgroupRef>,
    pub denied: bool,
}

/// How much of a process phase 1 can take from the cache.
pub enum Hit {
    /// Nothing changed: `status` and the parts.
    All(StatusRead, Arc<BasicParts>),
    /// Counters changed, not the size of the address space: the fds and command line
    /// (read `status` again, and `maps` unless the file and shared-memory pages mapped,
    /// `RssFile` and `RssShmem`, are as in the `status` given here).
    Parts(Arc<BasicParts>, Box<StatusRead>),
    /// The size of the address space changed too: as `Parts` while the process has as
    /// many open descriptors as when they were read, else everything again.
    PartsIfFds(Arc<BasicParts>),
    Miss,
}

/// What phase 1 did for a process.
pub enum Read {
    Reused,
    /// `status` and `maps` read again, the fds and command line reused.
    Status(StatusRead, Arc<BasicParts>),
    /// Everything read again.
    Full(StatusRead, Arc<BasicParts>),
}

struct Entry {
    stat: StatStamp,
    status: StatusRead,
    /// When the parts were read.
    read_at: Instant,
    basic: Arc<BasicParts>,
    detail: Option<Detail>,
    /// When `detail` was read.
    detail_at: Instant,
    /// `/proc/PID/io` `rchar` as last read (phase 2 and the candidates).
    rchar: Option<u64>,
    /// Read again this snapshot (changed, or too old): phase 3 reads it again.
    changed: bool,
    /// Its counters moved this snapshot (it is new, or its `stat` differs): the other
    /// mappers of its files are read again too (their PSS may have moved). A refresh for
    /// age alone does not move them.
    moved: bool,
    seen: bool,
}

/// Counts of the last snapshot, for `TWOFOLD_PROFILE` and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Processes of which only `stat` was read.
    pub unchanged: usize,
    /// Processes whose `status` and `maps` were read again, `fd` reused.
    pub status_read: usize,
    /// Processes read in full (phase 1).
    pub full_read: usize,
    /// Processes whose `smaps` (or `smaps_rollup`) were reused / read.
    pub detail_reused: usize,
    pub detail_read: usize,
}

/// The per-engine cache (see the module documentation for when an entry is reused).
pub struct ProcCache {
    entries: HashMap<i32, Entry>,
    max_age: Duration,
    now: Instant,
    /// Files of interest whose mappers must all be read again this snapshot.
    dirty_files: HashSet<FileKey>,
    /// Processes whose child or parent appeared or exited this snapshot.
    dirty_pids: HashSet<i32>,
    /// `stat` of each process, and `io` of those read every snapshot, kept open.
    pub stat_files: super::statfiles::KeptFiles,
    pub io_files: super::statfiles::KeptFiles,
    /// Files found not of interest, lent to each snapshot's gatherer.
    pub decisions: super::decisions::Decided,
    /// The walks of the directories named, lent to each snapshot's gatherer.
    pub walks: super::walkmemo::WalkMemo,
    pub stats: CacheStats,
}

impl Default for ProcCache {
    fn default() -> Self {
        ProcCache::new(MAX_AGE)
    }
}

impl ProcCache {
    pub fn new(max_age: Duration) -> Self {
        ProcCache {
            entries: HashMap::new(),
            max_age,
            now: Instant::now(),
            dirty_files: HashSet::new(),
            dirty_pids: HashSet::new(),
            stat_files: super::statfiles::KeptFiles::stat(),
            io_files: super::statfiles::KeptFiles::io(),
            decisions: super::decisions::Decided::new(max_age),
            walks: super::walkmemo::WalkMemo::new(max_age),
            stats: CacheStats::default(),
        }
    }

    /// What the cache lends each snapshot's gatherer (given back when the gather is done):
    /// a gather that fails half-way leaves empty ones of the same maximum age behind.
    pub fn lend(&mut self) -> (super::decisions::Decided, super::walkmemo::WalkMemo) {
        (
            std::mem::replace(
                &mut self.decisions,
                super::decisions::Decided::new(self.max_age),
            ),
            std::mem::replace(
                &mut self.walks,
                super::walkmemo::WalkMemo::new(self.max_age),
            ),
        )
    }

    /// Starts a snapshot.
    pub fn begin(&mut self) {
        self.now = Instant::now();
        self.dirty_files.clear();
        self.dirty_pids.clear();
        self.stats = CacheStats::default();
        for e in self.entries.values_mut() {
            e.changed = false;
            e.moved = false;
            e.seen = false;
        }
    }

    /// This pid's maximum age: between half of it and all of it, by pid.
    fn age_limit(&self, pid: i32) -> Duration {
        let spread = pid.unsigned_abs() % 16;
        self.max_age - self.max_age * spread / 32
    }

    /// What phase 1 can reuse for a process whose `stat` reads `stat`.
    pub fn lookup(&self, pid: i32, stat: &StatStamp) -> Hit {
        let Some(e) = self.entries.get(&pid) else {
            return Hit::Miss;
        };
        if self.now.duration_since(e.read_at) >= self.age_limit(pid)
            || e.stat.start_time != stat.start_time
            || e.stat.comm != stat.comm
        {
            // Aged, another process, or an exec (a new name): everything again.
            Hit::Miss
        } else if e.stat == *stat {
            Hit::All(e.status.clone(), Arc::clone(&e.basic))
        } else if e.stat.vsize_bytes != stat.vsize_bytes {
            Hit::PartsIfFds(Arc::clone(&e.basic))
        } else {
            Hit::Parts(Arc::clone(&e.basic), Box::new(e.status.clone()))
        }
    }

    /// Records phase 1 of a process.
    pub fn put_basic(&mut self, pid: i32, stat: StatStamp, read: Read) {
        let (status, basic) = match read {
            Read::Reused => {
                self.stats.unchanged += 1;
                if let Some(e) = self.entries.get_mut(&pid) {
                    e.seen = true;
                }
                return;
            }
            Read::Status(status, basic) => {
                self.stats.status_read += 1;
                if let Some(e) = self.entries.get_mut(&pid) {
                    e.seen = true;
                    e.changed = true;
                    e.moved = true;
                    e.stat = stat;
                    e.status = status;
                    e.basic = basic;
                    self.dirty_files
                        .extend(e.detail.iter().flat_map(|d| d.wanted.iter().copied()));
                }
                return;
            }
            Read::Full(status, basic) => (status, basic),
        };
        self.stats.full_read += 1;
        let ppid = stat.ppid;
        let start = stat.start_time;
        let moved = self.entries.get(&pid).is_none_or(|o| o.stat != stat);
        // A refresh for age alone keeps phase 3 (it has an age of its own).
        let kept = self
            .entries
            .get_mut(&pid)
            .filter(|_| !moved)
            .and_then(|o| Some((o.detail.take()?, o.detail_at)));
        let old = self.entries.insert(
            pid,
            Entry {
                stat,
                status,
                read_at: self.now,
                basic,
                changed: kept.is_none(),
                detail_at: kept.as_ref().map_or(self.now, |k| k.1),
                detail: kept.map(|k| k.0),
                rchar: None,
                moved,
                seen: true,
            },
        );
        match old {
            Some(o) => {
                if moved {
                    self.dirty_files
                        .extend(o.detail.into_iter().flat_map(|d| d.wanted));
                }
                if o.stat.start_time != start {
                    // Another process under the same pid: the old one exited.
                    self.dirty_pids.insert(o.stat.ppid);
                    self.dirty_pids.insert(ppid);
                }
            }
            None => {
                self.dirty_pids.insert(ppid);
            }
        }
    }

    /// Ends phase 1: forgets the processes not seen (they exited) and marks what they
    /// touched; `kept` are the processes phase 3 reads, with their wanted files.
    pub fn end_basic<'a>(&mut self, kept: impl Iterator<Item = (i32, &'a HashSet<FileKey>)>) {
        let gone: Vec<i32> = self
            .entries
            .iter()
            .filter(|(_, e)| !e.seen)
            .map(|(p, _)| *p)
            .collect();
        for pid in gone {
            self.stat_files.forget(pid);
            self.io_files.forget(pid);
            if let Some(o) = self.entries.remove(&pid) {
                self.dirty_files
                    .extend(o.detail.into_iter().flat_map(|d| d.wanted));
                self.dirty_pids.insert(o.stat.ppid);
            }
        }
        for (pid, wanted) in kept {
            if self.entries.get(&pid).is_some_and(|e| e.moved) {
                self.dirty_files.extend(wanted.iter().copied());
            }
        }
    }

    /// The minor and major page faults of `pid` at this snapshot's `stat` (`None` when it
    /// was not read).
    pub fn faults(&self, pid: i32) -> Option<(u64, u64)> {
        let e = self.entries.get(&pid).filter(|e| e.seen)?;
        Some((e.stat.minflt, e.stat.majflt))
    }

    /// The `rchar` read at an earlier snapshot, while nothing in `stat` moved since and
    /// the entry is within its maximum age: for a process that maps and holds no file of
    /// interest, whether it could hold a copy (phase 2). A read() into pages already
    /// resident is the blind spot a search has too (`dupes::moved`); the processes kept
    /// read it afresh (their proofs' fingerprints hold it).
    pub fn rchar(&self, pid: i32) -> Option<u64> {
        let e = self.entries.get(&pid).filter(|e| e.seen && !e.changed)?;
        e.rchar
    }

    /// Records the `rchar` of this snapshot.
    pub fn put_rchar(&mut self, pid: i32, rchar: Option<u64>) {
        if let Some(e) = self.entries.get_mut(&pid) {
            e.rchar = rchar;
        }
    }

    /// Phase 3 of a process still valid for this set of wanted files.
    pub fn detail(&self, pid: i32, wanted: &HashSet<FileKey>) -> Option<Detail> {
        let e = self.entries.get(&pid)?;
        if e.changed
            || self.dirty_pids.contains(&pid)
            || self.now.duration_since(e.detail_at) >= self.age_limit(pid) * DETAIL_AGE_FACTOR
        {
            return None;
        }
        let d = e.detail.as_ref()?;
        (d.wanted == *wanted && !wanted.iter().any(|k| self.dirty_files.contains(k)))
            .then(|| d.clone())
    }

    /// Records phase 3 of a process: `read` is `None` when the cached detail was reused.
    pub fn put_detail(&mut self, pid: i32, read: Option<Detail>) {
        match read {
            None => self.stats.detail_reused += 1,
            Some(d) => {
                self.stats.detail_read += 1;
                if let Some(e) = self.entries.get_mut(&pid) {
                    e.detail = Some(d);
                    e.detail_at = self.now;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_address_space_size_keeps_the_fds_on_condition_an_exec_never() {
        let mut c = ProcCache::new(Duration::from_secs(3600));
        let parts = Arc::new(BasicParts {
            fd_count: Some(900),
            ..BasicParts::default()
        });
        c.begin();
        c.put_basic(
            7,
            stamp(1, 100, 1),
            Read::Full(StatusRead::default(), parts),
        );
        c.end_basic(std::iter::empty());
        c.begin();
        // `vsize` moved: the fds are kept if their number holds (phase 1 checks it).
        assert!(
            matches!(c.lookup(7, &stamp(1, 200, 1)), Hit::PartsIfFds(p) if p.fd_count == Some(900))
        );
        // Only faults moved: the fds are kept.
        let faulted = StatStamp {
            minflt: 5,
            ..stamp(1, 100, 1)
        };
        assert!(matches!(c.lookup(7, &faulted), Hit::Parts(..)));
        // A new name (an exec) or another process under the pid: everything again.
        let exec = StatStamp {
            comm: "python3".into(),
            ..stamp(1, 200, 1)
        };
        assert!(matches!(c.lookup(7, &exec), Hit::Miss));
        assert!(matches!(c.lookup(7, &stamp(2, 100, 1)), Hit::Miss));
    }

    fn stamp(start: u64, vsize: u64, ppid: i32) -> StatStamp {
        StatStamp {
            ppid,
            start_time: start,
            vsize_bytes: vsize,
            ..StatStamp::default()
        }
    }

    fn detail(wanted: &HashSet<FileKey>) -> Detail {
        Detail {
            wanted: wanted.clone(),
            mappings: Vec::new(),
            rollup: None,
            cmdline: Vec::new(),
            cgroup: None,
            denied: false,
        }
    }

    type Tick<'a> = (&'a [(i32, StatStamp)], &'a [(i32, &'a HashSet<FileKey>)]);

    /// One snapshot as `gather` drives the cache: which processes phase 1 read in full,
    /// and which phase 3 read.
    fn tick(c: &mut ProcCache, (stamps, wanted): Tick) -> (Vec<i32>, Vec<i32>) {
        c.begin();
        let mut full = Vec::new();
        for (pid, s) in stamps {
            let read = match c.lookup(*pid, s) {
                Hit::All(..) => Read::Reused,
                Hit::Parts(p, _) => Read::Status(StatusRead::default(), p),
                // As phase 1 does: fds kept only with a known, unchanged count (these
                // parts have none).
                Hit::PartsIfFds(p) if p.fd_count.is_some() => {
                    Read::Status(StatusRead::default(), p)
                }
                Hit::PartsIfFds(_) | Hit::Miss => {
                    full.push(*pid);
                    Read::Full(StatusRead::default(), Arc::default())
                }
            };
            c.put_basic(*pid, s.clone(), read);
        }
        c.end_basic(wanted.iter().map(|(p, w)| (*p, *w)));
        let mut read = Vec::new();
        for (pid, w) in wanted {
            let d = c.detail(*pid, w);
            if d.is_none() {
                read.push(*pid);
            }
            c.put_detail(*pid, d.is_none().then(|| detail(w)));
        }
        (full, read)
    }

    /// Two mappers of one file and a bystander: one snapshot to fill, then what each
    /// change makes read again.
    #[test]
    fn reuse_until_a_stamp_a_co_mapper_or_a_relative_changes() {
        let f: HashSet<FileKey> = [FileKey::from_dev(1, 2)].into();
        let none = HashSet::new();
        let mut c = ProcCache::new(Duration::from_secs(3600));
        let base = vec![
            (10, stamp(1, 100, 1)),
            (11, stamp(1, 100, 1)),
            (12, stamp(1, 100, 1)),
        ];
        let w = [(10, &f), (11, &f), (12, &none)];
        assert_eq!(
            tick(&mut c, (&base, &w)),
            (vec![10, 11, 12], vec![10, 11, 12])
        );
        assert_eq!(tick(&mut c, (&base, &w)), (vec![], vec![]));
        assert_eq!(c.stats.unchanged, 3);
        // 10 faults: its status and maps are read again (not its fds), and both mappers' smaps.
        let mut faulted = base.clone();
        faulted[0].1.minflt = 5;
        assert_eq!(tick(&mut c, (&faulted, &w)), (vec![], vec![10, 11]));
        assert_eq!(c.stats.status_read, 1);
        // 10 maps more: maps and smaps again.
        let mut grown = faulted.clone();
        grown[0].1.vsize_bytes = 200;
        assert_eq!(tick(&mut c, (&grown, &w)), (vec![10], vec![10, 11]));
        assert_eq!(tick(&mut c, (&grown, &w)), (vec![], vec![]));
        // A child of 12 appears: 12's smaps are read again.
        let mut forked = grown.clone();
        forked.push((13, stamp(5, 100, 12)));
        let w2 = [(10, &f), (11, &f), (12, &none), (13, &none)];
        assert_eq!(tick(&mut c, (&forked, &w2)), (vec![13], vec![12, 13]));
        // 11 exits: 10 (same file) is read again.
        let left: Vec<_> = forked.iter().filter(|(p, _)| *p != 11).cloned().collect();
        let w3 = [(10, &f), (12, &none), (13, &none)];
        assert_eq!(tick(&mut c, (&left, &w3)), (vec![], vec![10]));
        // Pid 13 now names another process.
        let mut reused = left.clone();
        reused[2].1 = stamp(9, 100, 12);
        assert_eq!(tick(&mut c, (&reused, &w3)), (vec![13], vec![12, 13]));
    }

    /// `rchar` and the faults are kept while `stat` holds, and forgotten when it moves.
    #[test]
    fn rchar_is_reused_only_while_stat_holds() {
        let none = HashSet::new();
        let mut c = ProcCache::new(Duration::from_secs(3600));
        let base = vec![(10, stamp(1, 100, 1))];
        let w = [(10, &none)];
        tick(&mut c, (&base, &w));
        assert_eq!(c.rchar(10), None, "a new process has none");
        c.put_rchar(10, Some(4096));
        tick(&mut c, (&base, &w));
        assert_eq!(c.rchar(10), Some(4096));
        assert_eq!(c.faults(10), Some((0, 0)));
        let mut faulted = base.clone();
        faulted[0].1.minflt = 3;
        tick(&mut c, (&faulted, &w));
        assert_eq!(c.rchar(10), None, "it faulted: read again");
        assert_eq!(c.faults(10), Some((3, 0)));
        assert_eq!(c.faults(11), None);
    }

    /// A refresh for age alone reads the process again, not its co-mappers; a refresh
    /// that finds its counters moved reads them too.
    #[test]
    fn an_age_refresh_does_not_read_the_co_mappers_again() {
        let f: HashSet<FileKey> = [FileKey::from_dev(1, 2)].into();
        let mut c = ProcCache::new(Duration::from_secs(60));
        let base = vec![(10, stamp(1, 100, 1)), (11, stamp(1, 100, 1))];
        let w = [(10, &f), (11, &f)];
        assert_eq!(tick(&mut c, (&base, &w)), (vec![10, 11], vec![10, 11]));
        // 10 expires (its entry aged past the limit), nothing changed: phase 1 only.
        c.entries.get_mut(&10).unwrap().read_at = Instant::now() - Duration::from_secs(600);
        assert_eq!(tick(&mut c, (&base, &w)), (vec![10], vec![]));
        // Its phase 3 expires too (a longer age): read again, alone.
        c.entries.get_mut(&10).unwrap().detail_at = Instant::now() - Duration::from_secs(600);
        assert_eq!(tick(&mut c, (&base, &w)), (vec![], vec![10]));
        // 10 expires and faulted meanwhile: 11 is read again too.
        c.entries.get_mut(&10).unwrap().read_at = Instant::now() - Duration::from_secs(600);
        let mut faulted = base.clone();
        faulted[0].1.minflt = 3;
        assert_eq!(tick(&mut c, (&faulted, &w)), (vec![10], vec![10, 11]));
    }

    #[test]
    fn entries_expire_within_the_maximum_age() {
        let mut c = ProcCache::new(Duration::ZERO);
        let s = [(1, stamp(1, 1, 0))];
        assert_eq!(tick(&mut c, (&s, &[])).0, vec![1]);
        assert_eq!(tick(&mut c, (&s, &[])).0, vec![1]);
        let mut c = ProcCache::new(Duration::from_secs(3600));
        assert_eq!(tick(&mut c, (&s, &[])).0, vec![1]);
        assert_eq!(tick(&mut c, (&s, &[])).0, Vec::<i32>::new());
    }
}

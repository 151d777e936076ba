//! What a long-lived engine (`top`, `serve`, `record`) keeps between snapshots, so that a
//! snapshot of an unchanged process costs one small read instead of four and a page-table
//! walk.
//!
//! Every snapshot reads `/proc/PID/statm` of every process, and `/proc/PID/stat` of those
//! whose `statm` moved, that the engine watches (the holders of copies whose pages it
//! weighs) or whose entry aged ([`ProcCache::read_stamp`]; `stat` walks the
//! threads and costs five times as much). `stat` gives its start time (field 22, with
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
//!   ones without changing the parent's counters); `smaps_rollup` alone (a process that
//!   maps no file of interest: its sums are display columns, no count) at most every
//!   [`ROLLUP_EVERY`];
//! - `io` (`rchar`) of a process that maps and holds no file of interest and is no
//!   candidate, only when any of those changed (a candidate's is read every snapshot: it
//!   is in its proof's fingerprint);
//! - all of it when the entry is older than its maximum age (between half of
//!   [`MAX_AGE`] and all of it, spread by pid so that re-reads do not all fall on one
//!   snapshot), or [`DETAIL_AGE_FACTOR`] times that for a process none of whose threads
//!   ran since it was read ([`fresh`]); such a refresh, when `stat` has not changed, keeps
//!   phase 3 (read again after [`DETAIL_AGE_FACTOR`] times the maximum age) and does not
//!   make the other mappers of its files read again (nothing moved their PSS).
//!
//! A mapper's `smaps` of a file of interest is never kept where this snapshot does not read
//! every process (pids or a cgroup asked: its other mappers are unknown), nor when it was
//! read while another twofold could have mapped the file's pages for a moment (its copies
//! of cached pages: [`super::quiet::Quiet`]); another twofold's changes, or those of a
//! process left out of the pids asked, read the mappers of the files it maps again.
//!
//! What no counter shows, and only the maximum age bounds: a newly opened (not mapped) fd,
//! an `mprotect` or an `mremap` that moves a mapping (addresses and permissions in `maps`)
//! or a mapping that replaces another of the same size, before any page is touched, a
//! `setuid`, a changed command line (all made by the process: it ran), a move to another
//! cgroup, and the whole-process PSS/USS shift when an unrelated process maps or unmaps a
//! shared library. A one-shot `scan` keeps no cache and reads everything.
//!
//! Kernel documentation: <https://www.kernel.org/doc/html/latest/filesystems/proc.html>
//! (table 1-4, "Contents of the stat fields").

mod fresh;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use super::detail::{Detail, PageState};
pub use super::names::NamedFile;
use super::process::{FdTarget, StatusRead};
pub use super::statfiles::StatStamp;
use crate::sample::{FileKey, MappingSample};

/// An entry is read again after this long, whatever its counters say (a safety net).
pub const MAX_AGE: Duration = Duration::from_secs(120);

/// Phase 3 (`smaps`: a walk of the page tables, the costliest read) of an unchanged
/// process is read again after this many times its maximum age: what it shows that no
/// counter does is only the whole-process PSS/USS drift when unrelated processes map or
/// unmap shared libraries (the PSS of files of interest moves only with their mappers'
/// counters, which are watched).
pub const DETAIL_AGE_FACTOR: u32 = 3;

/// `smaps_rollup` of a process that maps no file of interest (a page-table walk of its
/// whole address space: a Python server holding 1 GiB costs a few milliseconds a read) is
/// read again at most this often while its counters move at every snapshot. Its sums are
/// the process table's PSS, USS, private/shared clean/dirty columns, never a count; the
/// RSS columns (`status`) are read whenever the counters move.
pub const ROLLUP_EVERY: Duration = Duration::from_secs(10);
/// ...or, where its read takes long, no sooner than this many times as long as it took
/// (each such process costs at most 0.01% of a core: a PyTorch process's `smaps_rollup`
/// takes 2–3 ms, read every 20–30 s; a CUDA process's 7–11 ms, its page tables map the
/// device's memory: every 60 s)...
pub const ROLLUP_COST_FACTOR: u32 = 10_000;
/// ...and at least this often.
pub const ROLLUP_MAX: Duration = Duration::from_secs(60);

/// How long the `smaps_rollup` of a moving process is kept, whose read took `took`.
pub fn rollup_every(took: Duration) -> Duration {
    (took * ROLLUP_COST_FACTOR).clamp(ROLLUP_EVERY, ROLLUP_MAX)
}

/// What phase 1 read of a process besides `status`.
#[derive(Debug, Default)]
pub struct BasicParts {
    pub maps: Vec<MappingSample>,
    pub fds: Vec<FdTarget>,
    pub cmdline: std::sync::Arc<[String]>,
    /// Model files its command line names, resolved when the command line was read.
    pub named: Vec<NamedFile>,
    pub denied: bool,
    /// It carries twofold's observer mark ([`super::observer`]): another twofold.
    pub observer: bool,
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

    /// Each file it maps, once.
    pub fn mapped_keys(&self) -> impl Iterator<Item = FileKey> + '_ {
        let first = &self.mapped_files().first;
        first.iter().map(|&i| self.maps[i as usize].key())
    }
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
    /// When the parts were read, and the task iterator's (start, run time) of the process
    /// then ([`fresh`]).
    read_at: Instant,
    ran: Option<(u64, u64)>,
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
    /// Seen in the last snapshot (its stamp then confirmed it).
    was_seen: bool,
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
    /// Of those read, processes that moved but whose mappings of the wanted files did not
    /// ([`PageState`]): `smaps_rollup` read, their mappings' values kept.
    pub pages_stood: usize,
    /// Of those read, reads made while another twofold could have mapped a file's pages:
    /// read again at the next snapshot.
    pub tainted: usize,
    /// Of the unchanged, those whose `statm` was not read: the task iterator showed
    /// nothing of theirs moved ([`super::taskview`]).
    pub statm_skipped: usize,
}

/// The per-engine cache (see the module documentation for when an entry is reused).
pub struct ProcCache {
    entries: HashMap<i32, Entry>,
    max_age: Duration,
    now: Instant,
    /// Files of interest whose mappers must all be read again this snapshot, with the
    /// processes whose change made them so.
    dirty_files: HashMap<FileKey, Vec<i32>>,
    /// Processes whose child or parent appeared or exited this snapshot.
    dirty_pids: HashSet<i32>,
    /// `statm` of each process, and `io` of those read every snapshot, kept open.
    pub statm_files: super::statfiles::KeptFiles,
    /// Processes whose `stat` is read at every snapshot (their page faults are needed:
    /// the holders of copies whose physical pages are weighed), set by the engine.
    pub watch: HashSet<i32>,
    pub io_files: super::statfiles::KeptFiles,
    /// Files found not of interest, lent to each snapshot's gatherer.
    pub decisions: super::decisions::Decided,
    /// The walks of the directories named, lent to each snapshot's gatherer.
    pub walks: super::walkmemo::WalkMemo,
    pub stats: CacheStats,
    /// Model files kept open between snapshots, and the stamps of the last snapshot's.
    pub held: super::heldfiles::HeldFiles,
    /// Every process's stamp in one read, where the task iterator loads.
    pub tasks: super::taskview::Tasks,
    /// Whether this snapshot reads every process's mappings (no pid or cgroup filter, or
    /// a filter whose gather reads the whole host): only then are all mappers of a file
    /// known, and a mapper's PSS of it kept while none of them changed.
    pub sees_host: bool,
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
            dirty_files: HashMap::new(),
            dirty_pids: HashSet::new(),
            statm_files: super::statfiles::KeptFiles::statm(),
            watch: HashSet::new(),
            io_files: super::statfiles::KeptFiles::io(),
            decisions: super::decisions::Decided::new(max_age),
            walks: super::walkmemo::WalkMemo::new(max_age),
            sees_host: true,
            stats: CacheStats::default(),
            held: super::heldfiles::HeldFiles::default(),
            tasks: super::taskview::Tasks::default(),
        }
    }

    /// What the cache lends each snapshot's gatherer (given back when the gather is done):
    /// a gather that fails half-way leaves empty ones of the same maximum age behind.
    pub fn lend(&mut self) -> (super::decisions::Decided, super::walkmemo::WalkMemo) {
        self.walks.begin();
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
            e.was_seen = e.seen;
            e.seen = false;
        }
    }

    /// This pid's maximum age: between half of it and all of it, by pid.
    fn age_limit(&self, pid: i32) -> Duration {
        let spread = pid.unsigned_abs() % 16;
        self.max_age - self.max_age * spread / 32
    }

    /// The stamp of `pid`: `statm` through its kept descriptor first; while it equals the
    /// one read with the cached stamp, the process is not watched and its entry is within
    /// its maximum age ([`ProcCache::quiet`]), the cached stamp (no `stat` read); otherwise
    /// `stat` is read by path. Returns the stamp and the `statm` descriptor opened here, for
    /// [`super::statfiles::KeptFiles::keep`].
    ///
    /// What `statm` does not see, and `stat` did: page faults that leave every counter of
    /// the address space as it was (a copy-on-write break of a page shared with a fork, a
    /// page reclaimed and faulted back within one interval), a name set with `prctl` and a
    /// new parent. Nothing kept depends on the first two but the share-out of copies'
    /// physical pages, whose holders are watched (`stat` read every snapshot); the last two
    /// show within the entry's maximum age.
    pub fn read_stamp(
        &self,
        root: &std::path::Path,
        pid: i32,
    ) -> Option<(StatStamp, Option<std::fs::File>)> {
        if let Some(quiet) = self.unmoved(pid) {
            self.tasks.skipped();
            return Some((quiet, None));
        }
        let (statm, opened) = self
            .statm_files
            .read(root, pid, super::statfiles::parse_statm)?;
        if let Some(quiet) = self.quiet(pid, &statm) {
            return Some((quiet, opened));
        }
        let text = std::fs::read_to_string(root.join(pid.to_string()).join("stat")).ok()?;
        let stamp = super::statfiles::parse_stat(&text)?;
        Some((
            StatStamp {
                statm: Some(statm),
                ..stamp
            },
            opened,
        ))
    }

    /// The stamp kept for `pid` when the task iterator says nothing of it moved since the
    /// last snapshot, which confirmed its entry ([`super::taskview`]), it is not watched
    /// and its entry is within its maximum age: not even `statm` need be read.
    fn unmoved(&self, pid: i32) -> Option<StatStamp> {
        let e = self.entries.get(&pid)?;
        (e.was_seen && self.tasks.unmoved(pid) && !self.watch.contains(&pid) && self.fresh(pid, e))
            .then(|| e.stat.clone())
    }

    /// The stamp kept for `pid` when its `statm` reads as when that stamp was read, it is
    /// not watched and its entry is within its maximum age: `stat` need not be read.
    pub fn quiet(&self, pid: i32, statm: &super::statfiles::Statm) -> Option<StatStamp> {
        let e = self.entries.get(&pid)?;
        (e.stat.statm.as_ref() == Some(statm) && !self.watch.contains(&pid) && self.fresh(pid, e))
            .then(|| e.stat.clone())
    }

    /// What phase 1 can reuse for a process whose `stat` reads `stat`.
    pub fn lookup(&self, pid: i32, stat: &StatStamp) -> Hit {
        let Some(e) = self.entries.get(&pid) else {
            return Hit::Miss;
        };
        if !self.fresh(pid, e) || e.stat.start_time != stat.start_time || e.stat.comm != stat.comm {
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
                let mut files: Vec<FileKey> = Vec::new();
                if let Some(e) = self.entries.get_mut(&pid) {
                    e.seen = true;
                    e.changed = true;
                    e.moved = true;
                    e.stat = stat;
                    e.status = status;
                    e.basic = basic;
                    files.extend(e.detail.iter().flat_map(|d| d.wanted.iter().copied()));
                }
                self.dirty(files, pid);
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
                ran: self.run_stamp(pid),
                basic,
                changed: kept.is_none(),
                detail_at: kept.as_ref().map_or(self.now, |k| k.1),
                detail: kept.map(|k| k.0),
                rchar: None,
                moved,
                seen: true,
                was_seen: false,
            },
        );
        match old {
            Some(o) => {
                if moved {
                    self.dirty(o.detail.into_iter().flat_map(|d| d.wanted), pid);
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
    /// touched; `kept` are the processes phase 3 reads, with their wanted files. A process
    /// not kept that maps one of those files (another twofold reading its pages, a process
    /// outside the pids asked) and moved, appeared or exited marks it too.
    pub fn end_basic<'a>(&mut self, kept: impl Iterator<Item = (i32, &'a HashSet<FileKey>)>) {
        self.close_unread_statm();
        let kept: HashMap<i32, &HashSet<FileKey>> = kept.collect();
        let all: HashSet<FileKey> = kept.values().flat_map(|w| w.iter().copied()).collect();
        let mapped = |b: &BasicParts| -> Vec<FileKey> {
            b.mapped_keys().filter(|k| all.contains(k)).collect()
        };
        let mut marks: Vec<(i32, Vec<FileKey>)> = Vec::new();
        let gone: Vec<i32> = self
            .entries
            .iter()
            .filter(|(_, e)| !e.seen)
            .map(|(p, _)| *p)
            .collect();
        for pid in gone {
            self.statm_files.forget(pid);
            self.io_files.forget(pid);
            if let Some(o) = self.entries.remove(&pid) {
                marks.push((pid, mapped(&o.basic)));
                self.dirty(o.detail.into_iter().flat_map(|d| d.wanted), pid);
                self.dirty_pids.insert(o.stat.ppid);
            }
        }
        for (pid, e) in self.entries.iter().filter(|(_, e)| e.moved) {
            match kept.get(pid) {
                Some(wanted) => marks.push((*pid, wanted.iter().copied().collect())),
                None if !all.is_empty() => marks.push((*pid, mapped(&e.basic))),
                None => {}
            }
        }
        for (pid, files) in marks {
            self.dirty(files, pid);
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
        let age = self.now.duration_since(e.detail_at);
        let unchanged = !e.changed
            && !self.dirty_pids.contains(&pid)
            && age < self.age_limit(pid) * DETAIL_AGE_FACTOR;
        // Only `smaps_rollup` (it maps no file of interest): whole-process sums that no
        // count uses, kept up to ROLLUP_EVERY (longer where it is slow to read) however
        // often the process moves.
        let d = e.detail.as_ref()?;
        let kept = unchanged || (wanted.is_empty() && age < rollup_every(d.took));
        if !kept || ((d.tainted || !self.sees_host) && d.maps_any(wanted)) {
            return None;
        }
        (d.wanted == *wanted && !wanted.iter().any(|k| self.dirty_files.contains_key(k)))
            .then(|| d.clone())
    }

    /// The parts phase 1 kept for `pid` this snapshot (its `maps` among them).
    pub fn parts(&self, pid: i32) -> Option<Arc<BasicParts>> {
        self.entries.get(&pid).map(|e| Arc::clone(&e.basic))
    }

    /// Marks `files` dirty this snapshot, by a change of `pid`.
    fn dirty(&mut self, files: impl IntoIterator<Item = FileKey>, pid: i32) {
        for f in files {
            let by = self.dirty_files.entry(f).or_default();
            if !by.contains(&pid) {
                by.push(pid);
            }
        }
    }

    /// Phase 3 of a process that changed, for [`Detail::pages`] to decide: kept within
    /// the same maximum age as an unchanged one's, read with page states, for the same
    /// wanted files, and no other process's change made the mappers of the files it maps
    /// read again (its own may have: whether its pages of them moved is what the page
    /// states say; a file it only holds open has no PSS of it here).
    pub fn detail_if_pages_stand(&self, pid: i32, wanted: &HashSet<FileKey>) -> Option<Detail> {
        let e = self.entries.get(&pid)?;
        let age = self.now.duration_since(e.detail_at);
        if wanted.is_empty()
            || self.dirty_pids.contains(&pid)
            || age >= self.age_limit(pid) * DETAIL_AGE_FACTOR
        {
            return None;
        }
        let d = e.detail.as_ref()?;
        // Another process's change moves this one's PSS of a file only where it maps it.
        let others = |k: &FileKey| {
            d.mappings.iter().any(|m| m.key() == *k)
                && self
                    .dirty_files
                    .get(k)
                    .is_some_and(|by| by.iter().any(|p| *p != pid))
        };
        let sure = self.sees_host && !d.tainted;
        (sure && d.pages.is_some() && d.wanted == *wanted && !wanted.iter().any(others))
            .then(|| d.clone())
    }

    /// Makes every phase 3 read `by` earlier (tests: time passing).
    #[cfg(test)]
    pub fn backdate_details(&mut self, by: Duration) {
        for e in self.entries.values_mut() {
            e.detail_at = e.detail_at.checked_sub(by).unwrap_or(e.detail_at);
        }
    }

    /// Records phase 3 of a process whose mappings' pages stood ([`PageState`]): the
    /// kept detail with the `smaps_rollup` read now, its age kept (its mappings' values
    /// were read then).
    pub fn put_detail_pages(&mut self, pid: i32, d: Detail) {
        self.stats.pages_stood += 1;
        if let Some(e) = self.entries.get_mut(&pid) {
            e.detail = Some(d);
        }
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
mod tests;

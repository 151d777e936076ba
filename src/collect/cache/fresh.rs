//! How long an entry stands: its maximum age, or [`DETAIL_AGE_FACTOR`] times it while the
//! process has not run since the entry was read.
//!
//! Whatever no counter shows and the maximum age is there to catch (a descriptor opened,
//! an `mprotect`, an `mremap` or a mapping replaced before any page is touched, a `setuid`,
//! an `exec` that keeps the name) is done by the process itself, so it runs: its threads'
//! run time (`se.sum_exec_runtime`, in nanoseconds, from the task iterator, which reads
//! every thread at each snapshot: [`super::super::taskview`]) moves. An idle process (the
//! hundreds of sleeping helpers and workers of a host) is read again three times less
//! often. What others do to it without it running is bounded by the longer age: a move
//! to another cgroup, and a rename of a file it holds or maps (its path in `maps` and
//! `fd`); a new parent (its parent exited) is not: the entry is fresh only while the
//! parent it had is there. Without the task iterator (not root, an old kernel, a
//! `/proc` that is not the host's) every entry has its maximum age.

use super::{Entry, ProcCache, DETAIL_AGE_FACTOR};

impl ProcCache {
    /// Whether the entry of `pid` stands this snapshot (see the module documentation).
    pub(super) fn fresh(&self, pid: i32, e: &Entry) -> bool {
        let age = self.now.duration_since(e.read_at);
        let limit = self.age_limit(pid);
        age < limit || (age < limit * DETAIL_AGE_FACTOR && self.idle_since_read(pid, e))
    }

    /// Whether the task iterator shows the process of this entry (its start), none of
    /// whose threads ran since the entry was read, and the parent it had then.
    fn idle_since_read(&self, pid: i32, e: &Entry) -> bool {
        let (Some(t), Some(then)) = (self.tasks.now(), e.ran) else {
            return false;
        };
        let parent = e.stat.ppid <= 0 || t.get(e.stat.ppid).is_some();
        parent && t.get(pid).is_some_and(|s| (s.start_ns, s.run_ns) == then)
    }

    /// The task iterator's (start, run time) of `pid` this snapshot.
    pub(super) fn run_stamp(&self, pid: i32) -> Option<(u64, u64)> {
        let s = self.tasks.now()?.get(pid)?;
        Some((s.start_ns, s.run_ns))
    }

    /// With the task iterator, a process whose stamp stood this snapshot had its `statm`
    /// left unread: its descriptor is closed (opened again by path when it moves), so that
    /// this process does not keep one per process on the host, each of which the
    /// task_file iterator visits ([`super::super::heldfiles::HeldFiles::want_pages`]).
    pub(super) fn close_unread_statm(&mut self) {
        if !self.tasks.loaded() {
            return;
        }
        let unread: Vec<i32> = (self.statm_files.pids())
            .filter(|p| self.tasks.unmoved(*p) && !self.watch.contains(p))
            .collect();
        for pid in unread {
            self.statm_files.forget(pid);
        }
    }
}

//! The task iterator as a live engine's cache sees it ([`super::bpf::tasks`]): loaded at
//! the first snapshot where it is wanted, read at the start of every snapshot, with the
//! last snapshot's stamps kept beside this one's, so that a process none of whose threads
//! ran, faulted or read since then, and whose address space's counters stand still, is
//! taken as unchanged without its `statm` ([`super::cache::ProcCache::read_stamp`]).

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::bpf::tasks::{TaskIter, TaskStamps};

/// Set: never load the task iterator; every process's `statm` is read (the benchmarks
/// and tests compare the two).
pub const OFF_VAR: &str = "TWOFOLD_NO_TASK_ITER";

/// Set by a process whose engines should read `/proc` unless told otherwise
/// ([`Tasks::set_wanted`]): the test binaries, whose own heap must not keep the BTF
/// parse's leftovers beside the files they write.
pub static OFF_IN_THIS_PROCESS: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

#[derive(Default)]
enum State {
    /// Not wanted: a one-shot engine, or a `/proc` that is not the host's.
    #[default]
    Off,
    Wanted,
    Loaded(Box<TaskIter>),
    /// Could not load: why.
    Failed(String),
}

#[derive(Default)]
pub struct Tasks {
    state: State,
    now: Option<TaskStamps>,
    before: Option<TaskStamps>,
    /// Processes taken as unchanged this snapshot without a `statm` read.
    pub statm_skipped: AtomicUsize,
}

impl Tasks {
    /// Loads the iterator at the first snapshot, unless [`OFF_VAR`] is set.
    pub fn want(&mut self) {
        if matches!(self.state, State::Off)
            && std::env::var_os(OFF_VAR).is_none()
            && !OFF_IN_THIS_PROCESS.load(Ordering::Relaxed)
        {
            self.state = State::Wanted;
        }
    }

    /// Loads it at the first snapshot, or never, whatever [`OFF_VAR`] says.
    pub fn set_wanted(&mut self, on: bool) {
        self.state = if on { State::Wanted } else { State::Off };
    }

    /// Reads this snapshot's stamps (loading the program the first time), keeping the last
    /// snapshot's. A failed read leaves none: every process is read from `/proc`.
    pub fn read(&mut self, proc_root: &Path) {
        if matches!(self.state, State::Wanted) {
            self.state = match TaskIter::load(proc_root) {
                Ok(it) => State::Loaded(Box::new(it)),
                Err(why) => State::Failed(why),
            };
            // Loading parsed the kernel's BTF (tens of MiB, freed): mimalloc keeps freed
            // pages for reuse and, with nothing else to free, kept these for good (a
            // `top` of one file: 70 MiB resident against 19). Handed back now.
            // SAFETY: mi_collect only walks mimalloc's own heaps; it is safe whether or
            // not mimalloc is the global allocator.
            unsafe { libmimalloc_sys::mi_collect(true) };
        }
        self.statm_skipped.store(0, Ordering::Relaxed);
        self.before = self.now.take();
        if let State::Loaded(it) = &mut self.state {
            self.now = it.read().ok();
        }
    }

    /// The page counts of the files this process holds open, read now (`None` without
    /// the iterator, or where the kernel refused its task_file part).
    pub fn held_pages(&mut self) -> Option<super::bpf::tasks::HeldPages> {
        match &mut self.state {
            State::Loaded(it) => it.held_pages().ok(),
            _ => None,
        }
    }

    /// This snapshot's stamps.
    pub fn now(&self) -> Option<&TaskStamps> {
        self.now.as_ref()
    }

    /// Whether both snapshots have a stamp of `pid` and nothing in it moved.
    pub fn unmoved(&self, pid: i32) -> bool {
        match (self.now.as_ref(), self.before.as_ref()) {
            (Some(now), Some(before)) => match (now.get(pid), before.get(pid)) {
                (Some(a), Some(b)) => a.unchanged_since(b),
                _ => false,
            },
            _ => false,
        }
    }

    /// Why the iterator is not used, where it was wanted.
    pub fn unavailable(&self) -> Option<&str> {
        match &self.state {
            State::Failed(why) => Some(why),
            _ => None,
        }
    }

    /// Whether it is loaded.
    pub fn loaded(&self) -> bool {
        matches!(self.state, State::Loaded(_))
    }

    pub(super) fn skipped(&self) {
        self.statm_skipped.fetch_add(1, Ordering::Relaxed);
    }
}

//! Where each changed process's memory is now, and whether (and where) it moved since an
//! earlier search's placement.

use std::collections::HashMap;
use std::sync::Arc;

use crate::collect::Roots;
use crate::dupes::moved::Placement;

/// Where each changed process's memory is now (read once per process and snapshot), and
/// whether it moved since a placement of an earlier search: one verdict per placement, as
/// the files of one search share it (a process that is a candidate for 200 small models
/// compared the same two placements 200 times a snapshot).
#[derive(Default)]
pub(super) struct Placed {
    now: std::collections::BTreeMap<i32, Option<Arc<Placement>>>,
    verdicts: HashMap<(i32, *const Placement), bool>,
    /// How many placements were read.
    pub(super) reads: usize,
}

impl Placed {
    /// Where `pid`'s memory is now: read once per snapshot, and kept as the placement of a
    /// search that follows (read before it, as a search's placement must be).
    pub(super) fn current(&mut self, roots: &Roots, pid: i32) -> Option<Arc<Placement>> {
        let reads = &mut self.reads;
        self.now
            .entry(pid)
            .or_insert_with(|| {
                *reads += 1;
                Placement::of(roots, pid).map(Arc::new)
            })
            .clone()
    }

    /// Whether `pid`'s memory is where it was at `then` (`false` when it cannot be known).
    pub(super) fn unmoved(&mut self, roots: &Roots, pid: i32, then: &Arc<Placement>) -> bool {
        let Some(now) = self.current(roots, pid) else {
            return false;
        };
        *self
            .verdicts
            .entry((pid, Arc::as_ptr(then)))
            .or_insert_with(|| !now.moved_since(then))
    }

    /// The memory of `pid` present now where it was at `then`; `None` when it cannot be
    /// known.
    pub(super) fn unmoved_ranges(
        &mut self,
        roots: &Roots,
        pid: i32,
        then: &Placement,
    ) -> Option<Vec<(u64, u64)>> {
        Some(self.current(roots, pid)?.unmoved_since(then))
    }
}

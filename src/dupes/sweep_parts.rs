//! The results of a [`super::sweep`] and the range arithmetic it uses.

use super::grid::PAGE;
use crate::model::dupes::SweepStats;

/// A confirmed copy of one piece.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    pub piece: usize,
    pub addr: u64,
    /// Index into the searched regions.
    pub region: usize,
    /// Present bytes of the copy that equal the file (credited).
    pub mem_bytes: u64,
    /// Whether the whole copy matched (else only some pages did).
    pub whole: bool,
}

/// A sampled page that is like a file (distributed as its bytes) and was not covered by a
/// copy when it was sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liked {
    pub addr: u64,
    /// Pages it stands for (the sampling step).
    pub pages: u64,
    /// The file, as an index into the grid's files.
    pub file: usize,
}

/// What a sweep found: the copies, the work done, whether it ended before the deadline,
/// and the pages like a file.
pub struct Outcome {
    pub hits: Vec<Hit>,
    pub stats: SweepStats,
    pub complete: bool,
    pub liked: Vec<Liked>,
}

/// The whole pages of `ranges`, sorted and merged.
pub(super) fn whole_pages(ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = ranges
        .iter()
        .map(|&(lo, hi)| (lo.next_multiple_of(PAGE), hi / PAGE * PAGE))
        .filter(|(lo, hi)| hi > lo)
        .collect();
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (lo, hi) in v {
        match out.last_mut() {
            Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// The parts of `[lo, hi)` outside the sorted, merged `covered`.
pub(super) fn uncovered(lo: u64, hi: u64, covered: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut at = lo;
    let first = covered.partition_point(|c| c.1 <= lo);
    for &(a, b) in covered[first..].iter().take_while(|c| c.0 < hi) {
        if a > at {
            out.push((at, a));
        }
        at = at.max(b);
    }
    if at < hi {
        out.push((at, hi));
    }
    out
}

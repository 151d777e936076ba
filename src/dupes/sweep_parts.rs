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

/// Memory to search for each thread a sweep starts (a window, where windows are smaller).
const PER_THREAD: u64 = 64 << 20;

/// Threads for a sweep of `windows` ((region, start, end)) of at most `window` bytes, up
/// to `max`: by the work, since each has its own handle and its own copy of the known
/// ranges (a search again of the few megabytes that moved in a large process stays on
/// one), and never more than there are windows.
pub fn threads_for(max: usize, windows: &[(usize, u64, u64)], window: u64) -> usize {
    let bytes: u64 = windows.iter().map(|(_, a, b)| b - a).sum();
    let per_thread = PER_THREAD.min(window).max(PAGE);
    let by_work = usize::try_from(bytes.div_ceil(per_thread)).unwrap_or(usize::MAX);
    max.min(by_work).clamp(1, windows.len().max(1))
}

#[cfg(test)]
mod threads_tests {
    use super::*;

    #[test]
    fn threads_follow_the_memory_to_search() {
        let mib = 1u64 << 20;
        // 8 MiB that moved in four places: one thread, however many CPUs.
        let small: Vec<_> = (0..4)
            .map(|i| (0, i * 16 * mib, i * 16 * mib + 2 * mib))
            .collect();
        assert_eq!(threads_for(16, &small, 256 * mib), 1);
        // 1 GiB in four windows: no more threads than windows.
        let big: Vec<_> = (0..4)
            .map(|i| (0, i * 256 * mib, (i + 1) * 256 * mib))
            .collect();
        assert_eq!(threads_for(16, &big, 256 * mib), 4);
        // 4 GiB: one per 64 MiB, up to the CPUs.
        let huge: Vec<_> = (0..16)
            .map(|i| (0, i * 256 * mib, (i + 1) * 256 * mib))
            .collect();
        assert_eq!(threads_for(16, &huge, 256 * mib), 16);
        assert_eq!(threads_for(2, &huge, 256 * mib), 2);
        // Small windows (a test's 1 MiB): a thread per window.
        let windows: Vec<_> = (0..8).map(|i| (0, i * mib, (i + 1) * mib)).collect();
        assert_eq!(threads_for(4, &windows, mib), 4);
        assert_eq!(threads_for(4, &[], mib), 1);
    }
}

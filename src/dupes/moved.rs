//! What moved in a process's memory since its last full search, from signals that cost
//! the target nothing: its present ranges (`PAGEMAP_SCAN`) and the physical frames of one
//! page in every 2 MiB of them (pagemap PFNs). No page is read, no soft-dirty bit is
//! cleared, nothing is write-protected.
//!
//! A copy of a model needs memory to hold it: newly faulted pages (the present ranges
//! grow) or pages freed and faulted again (same addresses, other frames). When neither
//! happened, the memory the last search saw is where it was, rewritten in place at most
//! (a KV cache, a batch buffer, allocator churn within resident pages), and that search
//! stands: the count stays exact between full searches. What this cannot see is a copy
//! written over pages the process already had resident at the same frames; the next full
//! search (within the cadence) finds it.

use crate::collect::memory::{ProcMemory, PM_PFN};
use crate::collect::Roots;
use crate::sample::PAGE_BYTES as PAGE;

use super::pagemap::PageMap;

/// One frame sampled every this many bytes of present memory.
const FRAME_EVERY: u64 = 2 << 20;

/// Where a process's searchable memory is: its present ranges and sampled frames (the
/// first page of each range and every 2 MiB-aligned page, so that two placements sample
/// the same addresses where their ranges agree).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    ranges: Vec<(u64, u64)>,
    /// (address, frame) of one page in every [`FRAME_EVERY`] bytes of the ranges.
    frames: Vec<(u64, u64)>,
}

impl Placement {
    /// The placement of `pid`'s searchable memory now; `None` when it cannot be known
    /// (no `PAGEMAP_SCAN`, frame numbers hidden without `CAP_SYS_ADMIN`, the process gone).
    pub fn of(roots: &Roots, pid: i32) -> Option<Placement> {
        let target = ProcMemory::open(&roots.proc, pid).ok()?;
        let maps = roots.proc.join(pid.to_string()).join("maps");
        let text = std::fs::read_to_string(&maps).ok()?;
        let regions = ProcMemory::regions(&maps, &text).ok()?;
        let mut ranges = Vec::new();
        for r in &regions {
            let pm = PageMap::scan(&target, r.start, r.end, r.kind).ok()??;
            ranges.extend(pm.ranges()?.iter().copied());
        }
        let mut frames = Vec::new();
        let mut one = Vec::new();
        for &(a, b) in &ranges {
            let mut at = a;
            while at < b {
                target.pagemap(at, at + PAGE, &mut one).ok()?;
                frames.push((at, one.first().map_or(0, |e| e & PM_PFN)));
                at = (at / FRAME_EVERY + 1) * FRAME_EVERY;
            }
        }
        // Without CAP_SYS_ADMIN the kernel reports every frame as 0: placement unknown.
        if !frames.is_empty() && frames.iter().all(|f| f.1 == 0) {
            return None;
        }
        Some(Placement { ranges, frames })
    }

    /// Whether memory moved since `old`: a page is present now outside `old`'s ranges
    /// (faulted in), or a page sampled both times sits in another frame (freed and
    /// faulted again). Pages freed since (ranges that shrank) move nothing: a copy cannot
    /// appear by freeing memory.
    pub fn moved_since(&self, old: &Placement) -> bool {
        let covered = |a: u64, b: u64| {
            let i = old.ranges.partition_point(|r| r.1 <= a);
            let mut at = a;
            for r in &old.ranges[i..] {
                if r.0 > at {
                    return false;
                }
                at = at.max(r.1);
                if at >= b {
                    return true;
                }
            }
            false
        };
        if self.ranges.iter().any(|&(a, b)| !covered(a, b)) {
            return true;
        }
        // Both are in address order ([`Placement::of`] walks the ranges upwards): one
        // pass over the two, no table.
        let sorted = |v: &[(u64, u64)]| v.is_sorted_by_key(|f| f.0);
        if !sorted(&self.frames) || !sorted(&old.frames) {
            let before: std::collections::HashMap<u64, u64> = old.frames.iter().copied().collect();
            return self
                .frames
                .iter()
                .any(|(a, f)| before.get(a).is_some_and(|g| g != f));
        }
        let mut j = 0;
        self.frames.iter().any(|&(a, f)| {
            j += old.frames[j..].partition_point(|g| g.0 < a);
            old.frames.get(j).is_some_and(|g| g.0 == a && g.1 != f)
        })
    }

    /// The memory present now that is where `old` saw it: present both times, outside
    /// the blocks whose sampled frame changed. What is not in it moved (faulted in since,
    /// or freed and faulted again) and is all a search needs to look at again.
    pub fn unmoved_since(&self, old: &Placement) -> Vec<(u64, u64)> {
        // Present both times (both lists sorted, disjoint).
        let mut both = Vec::new();
        let (mut i, mut j) = (0, 0);
        while i < self.ranges.len() && j < old.ranges.len() {
            let (a, b) = (self.ranges[i], old.ranges[j]);
            let (lo, hi) = (a.0.max(b.0), a.1.min(b.1));
            if lo < hi {
                both.push((lo, hi));
            }
            if a.1 < b.1 {
                i += 1;
            } else {
                j += 1;
            }
        }
        let before: std::collections::HashMap<u64, u64> = old.frames.iter().copied().collect();
        let mut changed: Vec<(u64, u64)> = self
            .frames
            .iter()
            .filter(|(a, f)| before.get(a).is_some_and(|g| g != f))
            .map(|&(a, _)| (a, (a / FRAME_EVERY + 1) * FRAME_EVERY))
            .collect();
        changed.sort_unstable();
        both.into_iter()
            .flat_map(|(lo, hi)| super::sweep_parts::uncovered(lo, hi, &changed))
            .collect()
    }

    /// Present bytes.
    pub fn present_bytes(&self) -> u64 {
        crate::collect::pagescan::bytes(&self.ranges)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pl` less the pages of `[p, p + len)`: as if that buffer had been freed.
    fn again_without(pl: &Placement, p: *mut libc::c_void, len: usize) -> Placement {
        let (a, b) = (p as u64, p as u64 + len as u64);
        let mut ranges = Vec::new();
        for &(x, y) in &pl.ranges {
            if x < a {
                ranges.push((x, y.min(a)));
            }
            if y > b {
                ranges.push((x.max(b), y));
            }
        }
        let frames = pl
            .frames
            .iter()
            .filter(|f| !(a..b).contains(&f.0))
            .copied()
            .collect();
        Placement { ranges, frames }
    }

    /// In this process: unchanged while a buffer is rewritten in place; moved when it
    /// grows, and when it is freed and allocated again at the same size.
    #[test]
    fn rewriting_in_place_does_not_move_growing_or_reallocating_does() {
        if !nix::unistd::geteuid().is_root() {
            println!("SKIPPED: frame numbers need root (CAP_SYS_ADMIN)");
            return;
        }
        let roots = Roots::live();
        let me = std::process::id() as i32;
        let len = 8 << 20;
        let map = |fill: u8| {
            // SAFETY: an anonymous private mapping this test owns and unmaps below.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            // SAFETY: within the mapping.
            unsafe { std::ptr::write_bytes(p as *mut u8, fill, len) };
            p
        };
        let p = map(1);
        let Some(before) = Placement::of(&roots, me) else {
            println!("SKIPPED: PAGEMAP_SCAN needs Linux 6.7");
            // SAFETY: the mapping made above.
            unsafe { libc::munmap(p, len) };
            return;
        };
        // SAFETY: within the mapping.
        unsafe { std::ptr::write_bytes(p as *mut u8, 2, len) };
        let same = Placement::of(&roots, me);
        // Freed and mapped again (the kernel often gives the same addresses back).
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, len) };
        let q = map(3);
        let again = Placement::of(&roots, me);
        let r = map(4);
        let grown = Placement::of(&roots, me);
        let grown = grown.unwrap_or_else(|| panic!("placement known"));
        // SAFETY: the mappings made above.
        unsafe {
            libc::munmap(q, len);
            libc::munmap(r, len);
        }
        // Other threads of the test binary allocate too: compare the test's own ranges.
        let (a, b) = (p as u64, p as u64 + len as u64);
        let within = |pl: &Placement| {
            let r: Vec<_> = pl
                .ranges
                .iter()
                .filter(|r| r.0 < b && r.1 > a)
                .copied()
                .collect();
            let f: Vec<_> = pl
                .frames
                .iter()
                .filter(|f| (a..b).contains(&f.0))
                .copied()
                .collect();
            (r, f)
        };
        let same = same.unwrap_or_else(|| panic!("placement known"));
        assert!(!within(&before).1.is_empty());
        assert_eq!(
            within(&before),
            within(&same),
            "rewritten in place: not moved"
        );
        let again = again.unwrap_or_else(|| panic!("placement known"));
        assert_ne!(
            within(&before),
            within(&again),
            "freed and faulted again: moved"
        );
        assert!(again.moved_since(&before), "freed and faulted again: moved");
        let grown = grown.clone();
        assert!(grown.moved_since(&again), "grown: moved");
        // Shrinking moves nothing: the placement with the new buffer, against without.
        assert!(!again_without(&grown, r, len).moved_since(&grown));
        assert!(grown.present_bytes() >= again.present_bytes() + len as u64 / 2);
    }
}

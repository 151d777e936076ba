//! One pass over a process's memory with a [`Grid`]: sample one page in `stride`, look
//! the windows up, and confirm every candidate against the file byte by byte.
//!
//! Confirmation compares, in full, the first and last page of the candidate copy and every
//! page of it that lies on the sampling stride (with `stride = 1`: every page). If one of
//! them differs the copy is partial, and every page of it is compared (the search widens
//! to full sampling there); pages equal to the file are credited, as long as they carry
//! information (a page of zeros matches any zero page). Only present pages are ever read
//! (pagemap), and inside file mappings only anonymous ones, so nothing is faulted in.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::grid::{hash, Grid, PAGE, WIN};
use super::index::CopyKind;
use crate::collect::memory::{ProcMemory, Region, IOV_MAX};

use super::sweep_parts::{uncovered, whole_pages};
pub use super::sweep_parts::{Hit, Liked, Outcome};
pub use crate::model::dupes::SweepStats;

pub struct Sweep<'a> {
    pub grid: &'a Grid,
    pub target: &'a ProcMemory,
    pub stride: u64,
    /// Compare every page of every copy (`dupes`), not only those on the stride.
    pub exact: bool,
    pub deadline: Option<Instant>,
    /// Bytes swept and a cancel flag, watched by another thread (`top`'s `p`).
    pub progress: Option<&'a super::Progress>,
    /// Threads to search windows of memory on (1: this one).
    pub threads: usize,
    /// Bytes of a window ([`WINDOW`]).
    pub window: u64,
    /// Memory ranges that hold copies already known (an earlier search's, checked in
    /// place since): not sampled, and no copy that overlaps them is confirmed.
    pub known: &'a [(u64, u64)],
    /// Signatures of the files: sampled pages no copy covers that are like a file are
    /// kept ([`Liked`]), for the estimate of memory that is no known form of it.
    pub likeness: Option<&'a super::likeness::Likeness>,
    /// Grid files the process came to (see [`Sweep::preferred`]).
    pub prefer: &'a [usize],
}

struct State {
    stats: SweepStats,
    hits: Vec<Hit>,
    /// Credited memory ranges, start → end.
    credited: BTreeMap<u64, u64>,
    seen: HashSet<(usize, u64)>,
    /// Confirmed copies: (piece, address).
    confirmed: HashSet<(usize, u64)>,
    extended: HashSet<(usize, u64)>,
    liked: Vec<Liked>,
    /// How many of the shared ranges are in `credited`.
    synced: usize,
    buf: Buffers,
}

impl State {
    fn overlaps(&self, a: u64, b: u64) -> bool {
        self.credited
            .range(..b)
            .next_back()
            .is_some_and(|(_, end)| *end > a)
    }

    /// `[a, b)` lies within one credited range: nothing in it is left to find.
    fn covered(&self, a: u64, b: u64) -> bool {
        self.credited
            .range(..=a)
            .next_back()
            .is_some_and(|(_, end)| *end >= b)
    }
}

pub use super::compare::{Buffers, Compare, Placed, Span, SPOT_PAGES};
pub use super::pagemap::PageMap;

/// Regions are read a window of this many bytes at a time (512 KiB of pagemap entries
/// where PAGEMAP_SCAN is missing), and windows are what threads share out.
pub const WINDOW: u64 = 256 << 20;

/// Regions larger than this are skipped when `smaps` says nothing of them is resident
/// (without PAGEMAP_SCAN: pagemap costs 8 bytes per page of address space).
const HUGE_REGION: u64 = 64 << 30;

/// From this stride on, the pagemap entries of the sampled pages are read one by one
/// (one syscall each) rather than the whole region's (about 30 ns a page).
const SPARSE_PAGEMAP_STRIDE: u64 = 16;

/// Copies confirmed by any thread of one sweep, so that the others skip their pages.
#[derive(Default)]
struct Shared {
    /// Bumped with every range pushed: a thread locks only when it moved.
    generation: AtomicUsize,
    credited: Mutex<Vec<(u64, u64)>>,
}

/// A thread's scratch space for sampled pages.
struct Scratch {
    one: Vec<u64>,
    buf: Vec<u8>,
    addrs: Vec<u64>,
    cands: Vec<(usize, u64)>,
}

/// What a sweep needs besides the target: one per thread, each with its own handle.
#[derive(Clone, Copy)]
struct Plan<'a> {
    grid: &'a Grid,
    stride: u64,
    exact: bool,
    deadline: Option<Instant>,
    progress: Option<&'a super::Progress>,
    window: u64,
    likeness: Option<&'a super::likeness::Likeness>,
    prefer: &'a [usize],
}

impl State {
    fn new(stride: u64, known: &[(u64, u64)]) -> State {
        let mut credited = BTreeMap::new();
        for &(lo, hi) in known.iter().filter(|(lo, hi)| hi > lo) {
            let e = credited.entry(lo).or_insert(hi);
            *e = (*e).max(hi);
        }
        State {
            stats: SweepStats {
                stride_pages: stride,
                ..SweepStats::default()
            },
            hits: Vec::new(),
            credited,
            synced: 0,
            seen: HashSet::new(),
            confirmed: HashSet::new(),
            extended: HashSet::new(),
            liked: Vec::new(),
            buf: Buffers::default(),
        }
    }

    /// Takes in the ranges other threads confirmed since the last look.
    fn sync(&mut self, shared: Option<&Shared>) {
        let Some(sh) = shared else { return };
        if sh.generation.load(Ordering::Acquire) == self.synced {
            return;
        }
        let all = sh.credited.lock().unwrap_or_else(|p| p.into_inner());
        for &(lo, hi) in &all[self.synced.min(all.len())..] {
            let e = self.credited.entry(lo).or_insert(hi);
            *e = (*e).max(hi);
        }
        self.synced = all.len();
    }
}

impl Sweep<'_> {
    /// Past the deadline, or cancelled.
    fn stopped(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
            || self.progress.is_some_and(|p| p.cancelled())
            || crate::collect::stop::stopping()
    }

    fn plan(&self) -> Plan<'_> {
        Plan {
            grid: self.grid,
            stride: self.stride,
            exact: self.exact,
            deadline: self.deadline,
            progress: self.progress,
            window: self.window,
            likeness: self.likeness,
            prefer: self.prefer,
        }
    }

    /// Searches `regions`; returns the hits, the work done, and whether every region was
    /// searched before the deadline. Regions are cut into windows of `window` bytes,
    /// searched on up to `threads` threads, each reading through its own handle.
    pub fn run(&self, regions: &[Region]) -> io::Result<(Vec<Hit>, SweepStats, bool)> {
        let o = self.run_all(regions)?;
        Ok((o.hits, o.stats, o.complete))
    }

    /// [`Sweep::run`], with the sampled pages like a file that no copy found covers.
    pub fn run_all(&self, regions: &[Region]) -> io::Result<Outcome> {
        let mut stats = SweepStats {
            regions: regions.len(),
            stride_pages: self.stride,
            ..SweepStats::default()
        };
        // Where PAGEMAP_SCAN works, an empty window costs one call, so huge regions need
        // no `smaps` (a walk of the whole address space) to be skipped.
        let huge = regions.iter().find(|r| r.end - r.start > HUGE_REGION);
        let rss = match huge {
            Some(h) if PageMap::scan(self.target, h.start, h.start + PAGE, h.kind)?.is_none() => {
                self.target.rss_by_start().ok()
            }
            _ => None,
        };
        if let Some(p) = self.progress {
            p.add_total(regions.iter().map(|r| r.end - r.start).sum());
        }
        let mut windows = Vec::new();
        let known = whole_pages(self.known);
        for (ri, r) in regions.iter().enumerate() {
            stats.mapped_bytes += r.end - r.start;
            // A huge reservation (CUDA, ASan, JVM heaps) that holds nothing is skipped;
            // one that holds something is read a window at a time (bounded memory).
            if r.end - r.start > HUGE_REGION
                && rss.as_ref().is_some_and(|m| m.get(&r.start) == Some(&0))
            {
                if let Some(p) = self.progress {
                    p.add_done(r.end - r.start);
                }
                continue;
            }
            // Whole pages of copies already known are never sampled: no window walks
            // them (a search again of a process that holds a 1 GiB copy walks the rest).
            let pieces = uncovered(r.start, r.end, &known);
            if let Some(p) = self.progress {
                p.add_done(r.end - r.start - pieces.iter().map(|(a, b)| b - a).sum::<u64>());
            }
            for (a, b) in pieces {
                let mut w0 = a;
                while w0 < b {
                    let w1 = (w0 + self.window.max(PAGE)).min(b);
                    windows.push((ri, w0, w1));
                    w0 = w1;
                }
            }
        }
        let threads = super::sweep_parts::threads_for(self.threads, &windows, self.window);
        let next = AtomicUsize::new(0);
        let shared = Shared::default();
        let shared = (threads > 1).then_some(&shared);
        let (stride, known) = (self.stride, self.known);
        let work = |sweep: &Sweep| -> io::Result<(State, bool)> {
            let mut st = State::new(stride, known);
            let mut sc = Scratch {
                one: Vec::new(),
                // Grown to what a batch reads (up to IOV_MAX samples of 2-4 KiB): a small
                // process searched every few seconds does not zero and fault megabytes.
                buf: Vec::new(),
                addrs: Vec::with_capacity(IOV_MAX),
                cands: Vec::new(),
            };
            loop {
                let Some(&(ri, w0, w1)) = windows.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    return Ok((st, true));
                };
                if !sweep.window(&mut st, &mut sc, shared, &regions[ri], ri, w0, w1)? {
                    return Ok((st, false));
                }
                if let Some(p) = sweep.progress {
                    p.add_done(w1 - w0);
                }
            }
        };
        let results: Vec<io::Result<(State, bool)>> = if threads <= 1 {
            vec![work(self)]
        } else {
            let handles = (1..threads)
                .map(|_| self.target.try_clone())
                .collect::<io::Result<Vec<ProcMemory>>>()?;
            let plan = self.plan();
            let work = &work;
            std::thread::scope(|s| {
                let others: Vec<_> = handles
                    .into_iter()
                    .map(|target| {
                        s.spawn(move || {
                            crate::collect::on_worker(crate::collect::Worker::Sweep, || {
                                work(&Sweep {
                                    grid: plan.grid,
                                    target: &target,
                                    stride: plan.stride,
                                    exact: plan.exact,
                                    deadline: plan.deadline,
                                    progress: plan.progress,
                                    threads: 1,
                                    window: plan.window,
                                    known,
                                    likeness: plan.likeness,
                                    prefer: plan.prefer,
                                })
                            })
                        })
                    })
                    .collect();
                let mut out = vec![work(self)];
                out.extend(
                    others
                        .into_iter()
                        .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))),
                );
                out
            })
        };
        let mut complete = true;
        let mut hits = Vec::new();
        let mut liked = Vec::new();
        for r in results {
            let (st, done) = r?;
            complete &= done;
            stats.present_bytes += st.stats.present_bytes;
            stats.sampled_pages += st.stats.sampled_pages;
            stats.candidates += st.stats.candidates;
            stats.rejected += st.stats.rejected;
            stats.compared_bytes += st.buf.compared_bytes;
            hits.extend(st.hits);
            liked.extend(st.liked);
        }
        let hits = self.once(hits, regions);
        // A page sampled before a copy over it was confirmed is that copy's.
        let mut spans: Vec<(u64, u64)> = hits
            .iter()
            .map(|h| (h.addr, h.addr + self.grid.pieces[h.piece].mem_len))
            .collect();
        spans.sort_unstable();
        liked.retain(|l| {
            let i = spans.partition_point(|s| s.0 <= l.addr);
            !spans[..i].iter().rev().take(64).any(|s| s.1 > l.addr)
        });
        liked.sort_by_key(|l| l.addr);
        Ok(Outcome {
            hits,
            stats,
            complete,
            liked,
        })
    }

    /// The hits of every thread in address order, each memory range credited once: two
    /// windows searched apart can both confirm a copy that spans them.
    fn once(&self, mut hits: Vec<Hit>, regions: &[Region]) -> Vec<Hit> {
        let range = |h: &Hit| {
            let r = &regions[h.region];
            let len = self.grid.pieces[h.piece].mem_len;
            (h.addr.max(r.start), (h.addr + len).min(r.end))
        };
        hits.sort_by_key(|h| (range(h), h.piece));
        hits.dedup_by_key(|h| (h.piece, h.addr));
        let mut end = 0;
        hits.retain(|h| {
            let (lo, hi) = range(h);
            let keep = lo >= end;
            if keep {
                end = hi;
            }
            keep
        });
        hits
    }

    /// Samples the window `[w0, w1)` of region `r` and confirms what its samples find;
    /// `false` when stopped before the end.
    #[allow(clippy::too_many_arguments)]
    fn window(
        &self,
        st: &mut State,
        sc: &mut Scratch,
        shared: Option<&Shared>,
        r: &Region,
        ri: usize,
        w0: u64,
        w1: u64,
    ) -> io::Result<bool> {
        if self.stopped() {
            return Ok(false);
        }
        let sampling = self.grid.sampling(self.stride);
        let sample_len = sampling.len;
        // Pages between samples: the stride, or every page for small tensors.
        let stride = sampling.step;
        let first = (w0 / PAGE).next_multiple_of(stride) * PAGE;
        let scanned = PageMap::scan(self.target, w0, w1, r.kind)
            .map_err(|e| io::Error::other(format!("{e:#}")))?;
        let pm;
        let pages: Vec<u64> = if let Some(p) = scanned {
            // Present ranges from the kernel's page-table walk: a few calls per window,
            // and only the pages inside them are visited.
            pm = p;
            st.stats.present_bytes += pm.eligible_bytes(r);
            pm.sampled(r, first, w1, stride * PAGE)
        } else if stride >= SPARSE_PAGEMAP_STRIDE {
            pm = PageMap::default();
            let mut v = Vec::new();
            for a in (first..w1).step_by((stride * PAGE) as usize) {
                self.target
                    .pagemap(a, a + PAGE, &mut sc.one)
                    .map_err(|e| io::Error::other(format!("{e:#}")))?;
                if sc
                    .one
                    .first()
                    .is_some_and(|e| ProcMemory::eligible(*e, r.kind))
                {
                    v.push(a);
                }
            }
            st.stats.present_bytes += v.len() as u64 * stride * PAGE;
            v
        } else {
            pm = PageMap::read_entries(self.target, w0, w1)?;
            st.stats.present_bytes += pm.eligible_bytes(r);
            pm.sampled(r, first, w1, stride * PAGE)
        };
        for batch in pages.chunks(IOV_MAX) {
            if self.stopped() {
                return Ok(false);
            }
            st.sync(shared);
            sc.addrs.clear();
            sc.addrs
                .extend(batch.iter().copied().filter(|a| !st.covered(*a, *a + PAGE)));
            if sc.addrs.is_empty() {
                continue;
            }
            let pitch = ProcMemory::pitch(sample_len);
            let need = sc.addrs.len() * pitch;
            if sc.buf.len() < need {
                sc.buf.resize(need, 0);
            }
            let read = match self.target.gather(&sc.addrs, sample_len, &mut sc.buf) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => 0,
                Err(e) => return Err(e),
            };
            for k in 0..read {
                let page = sc.addrs[k];
                if st.covered(page, page + PAGE) {
                    continue;
                }
                st.stats.sampled_pages += 1;
                let s = &sc.buf[k * pitch..k * pitch + sample_len];
                if let Some(file) = self.likeness.and_then(|l| l.like(s)) {
                    st.liked.push(Liked {
                        addr: page,
                        pages: stride,
                        file,
                    });
                }
                sc.cands.clear();
                for &d in sampling.positions(page) {
                    let w = &s[d as usize..d as usize + WIN];
                    if w[..8] == w[8..] {
                        continue;
                    }
                    let h = hash(w);
                    if !self.grid.maybe(h) {
                        continue;
                    }
                    let at = page + u64::from(d);
                    self.grid.lookup(h, |p, m| {
                        if at >= m {
                            sc.cands.push((p, at - m));
                        }
                    });
                }
                for i in 0..sc.cands.len() {
                    let (p, a) = sc.cands[i];
                    let before = st.hits.len();
                    self.consider(st, &pm, r, ri, p, a)?;
                    if let Some(sh) = shared.filter(|_| st.hits.len() > before) {
                        let mut all = sh.credited.lock().unwrap_or_else(|p| p.into_inner());
                        for h in &st.hits[before..] {
                            let len = self.grid.pieces[h.piece].mem_len;
                            all.push((h.addr.max(r.start), (h.addr + len).min(r.end)));
                        }
                        sh.generation.store(all.len(), Ordering::Release);
                    }
                }
            }
        }
        Ok(true)
    }

    /// Confirms piece `p` at `a` (once), credits it, and extends the run to the file's
    /// small neighbours when it is an identical copy.
    fn consider(
        &self,
        st: &mut State,
        pm: &PageMap,
        r: &Region,
        ri: usize,
        p: usize,
        a: u64,
    ) -> io::Result<()> {
        let piece = &self.grid.pieces[p];
        // The part of the copy inside this region (a copy can begin or end outside it: a
        // run of a larger tensor, or of a file twofold cannot parse).
        let (lo, hi) = (a.max(r.start), (a + piece.mem_len).min(r.end));
        if hi <= lo || st.overlaps(lo, hi) || !st.seen.insert((p, a)) {
            return Ok(());
        }
        st.stats.candidates += 1;
        let place = |q| Placed {
            region: r,
            span: self.span(q),
            addr: a,
            lo,
            hi,
        };
        let Some((bytes, whole)) = self.compare().confirm(&mut st.buf, pm, &place(p))? else {
            st.stats.rejected += 1;
            return Ok(());
        };
        let (p, bytes, whole) = self
            .preferred(&mut st.buf, pm, p, &place)?
            .unwrap_or((p, bytes, whole));
        let piece = &self.grid.pieces[p];
        st.credited.insert(lo, hi);
        st.confirmed.insert((p, a));
        st.hits.push(Hit {
            piece: p,
            addr: a,
            region: ri,
            mem_bytes: bytes,
            whole,
        });
        // Run extension: a copy of the whole file holds every tensor at its file offset
        // from one base; small tensors the stride may step over are checked there. A
        // small tensor is often a copy on its own (an allocation of its own): its copy
        // extends only when a neighbour in the file is also at that base.
        let guaranteed = (self.stride * self.grid.every + 1) * PAGE;
        if piece.kind == CopyKind::Identical && a >= piece.file_offset {
            let base = a - piece.file_offset;
            let run = !st.extended.contains(&(piece.file, base))
                && (piece.mem_len >= guaranteed || self.neighbour_at(st, pm, r, ri, p, base)?);
            if run && st.extended.insert((piece.file, base)) {
                let small: Vec<usize> = (0..self.grid.pieces.len())
                    .filter(|&q| {
                        let x = &self.grid.pieces[q];
                        q != p
                            && x.file == piece.file
                            && x.kind == CopyKind::Identical
                            && x.mem_len < guaranteed
                    })
                    .collect();
                for q in small {
                    let at = base + self.grid.pieces[q].file_offset;
                    self.consider(st, pm, r, ri, q, at)?;
                }
            }
        }
        Ok(())
    }

    /// Whether the previous or next piece of `p`'s file is copied at `base` too.
    fn neighbour_at(
        &self,
        st: &mut State,
        pm: &PageMap,
        r: &Region,
        ri: usize,
        p: usize,
        base: u64,
    ) -> io::Result<bool> {
        for q in [self.grid.prev[p], self.grid.next[p]].into_iter().flatten() {
            let at = base + self.grid.pieces[q].file_offset;
            if !st.confirmed.contains(&(q, at)) {
                self.consider(st, pm, r, ri, q, at)?;
            }
            if st.confirmed.contains(&(q, at)) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Piece `p` as comparisons need it.
    pub(super) fn span(&self, p: usize) -> Span<'_> {
        let piece = &self.grid.pieces[p];
        Span {
            bytes: &self.grid.files[piece.file].bytes,
            kind: piece.kind,
            file_offset: piece.file_offset,
            mem_len: piece.mem_len,
        }
    }

    pub(super) fn compare(&self) -> Compare<'_> {
        Compare {
            target: self.target,
            stride: self.stride,
            exact: self.exact,
        }
    }
}

#[cfg(test)]
#[path = "sweep_tests.rs"]
mod tests;

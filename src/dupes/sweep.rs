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
use std::time::Instant;

use super::filebytes::FileBytes;
use super::grid::{hash, Grid, PAGE, WIN};
use super::index::{periodic, Convert, CopyKind};
use crate::collect::memory::{ProcMemory, Region, IOV_MAX};

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
    buf: Buffers,
}

/// Scratch space of comparisons, and the bytes they compared.
#[derive(Default)]
pub struct Buffers {
    mem: Vec<u8>,
    src: Vec<u8>,
    conv: Vec<u8>,
    pub compared_bytes: u64,
}

impl State {
    /// The search's result; `complete`: every region was searched.
    fn finish(mut self, complete: bool) -> (Vec<Hit>, SweepStats, bool) {
        self.stats.compared_bytes = self.buf.compared_bytes;
        (self.hits, self.stats, complete)
    }
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

pub use super::pagemap::PageMap;

/// Regions are read a window of this many bytes at a time (2 MiB of pagemap entries).
const WINDOW: u64 = 1 << 30;
/// Regions larger than this are skipped when `smaps` says nothing of them is resident.
const HUGE_REGION: u64 = 64 << 30;

/// From this stride on, the pagemap entries of the sampled pages are read one by one
/// (one syscall each) rather than the whole region's (about 30 ns a page).
const SPARSE_PAGEMAP_STRIDE: u64 = 16;

impl Sweep<'_> {
    /// Past the deadline, or cancelled.
    fn stopped(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
            || self.progress.is_some_and(|p| p.cancelled())
    }

    /// Searches `regions`; returns the hits, the work done, and whether every region was
    /// searched before the deadline.
    pub fn run(&self, regions: &[Region]) -> io::Result<(Vec<Hit>, SweepStats, bool)> {
        let mut st = State {
            stats: SweepStats {
                regions: regions.len(),
                stride_pages: self.stride,
                ..SweepStats::default()
            },
            hits: Vec::new(),
            credited: BTreeMap::new(),
            seen: HashSet::new(),
            confirmed: HashSet::new(),
            extended: HashSet::new(),
            buf: Buffers::default(),
        };
        let mut pm;
        let mut one = Vec::new();
        let sampling = self.grid.sampling(self.stride);
        let sample_len = sampling.len;
        let mut buf = vec![0u8; IOV_MAX * sample_len];
        let mut addrs = Vec::with_capacity(IOV_MAX);
        let mut cands: Vec<(usize, u64)> = Vec::new();
        // Pages between samples: the stride, or every page for small tensors.
        let stride = sampling.step;
        let rss = regions
            .iter()
            .any(|r| r.end - r.start > HUGE_REGION)
            .then(|| self.target.rss_by_start().ok())
            .flatten();
        if let Some(p) = self.progress {
            p.add_total(regions.iter().map(|r| r.end - r.start).sum());
        }
        for (ri, r) in regions.iter().enumerate() {
            if let (Some(p), Some(prev)) = (self.progress, ri.checked_sub(1)) {
                p.add_done(regions[prev].end - regions[prev].start);
            }
            if self.stopped() {
                return Ok(st.finish(false));
            }
            st.stats.mapped_bytes += r.end - r.start;
            // A huge reservation (CUDA, ASan, JVM heaps) that holds nothing is skipped;
            // one that holds something is read a window at a time (bounded memory).
            if r.end - r.start > HUGE_REGION
                && rss.as_ref().is_some_and(|m| m.get(&r.start) == Some(&0))
            {
                continue;
            }
            let mut w0 = r.start;
            while w0 < r.end {
                let w1 = (w0 + WINDOW).min(r.end);
                if self.stopped() {
                    return Ok(st.finish(false));
                }
                let first = (w0 / PAGE).next_multiple_of(stride) * PAGE;
                let scanned = PageMap::scan(self.target, w0, w1, r.kind)
                    .map_err(|e| io::Error::other(format!("{e:#}")))?;
                let pages: Vec<u64> = if let Some(p) = scanned {
                    // Present ranges from the kernel's page-table walk: a few calls per
                    // window, and only the pages inside them are visited.
                    pm = p;
                    st.stats.present_bytes += pm.eligible_bytes(r);
                    pm.sampled(r, first, w1, stride * PAGE)
                } else if stride >= SPARSE_PAGEMAP_STRIDE {
                    pm = PageMap::default();
                    let mut v = Vec::new();
                    for a in (first..w1).step_by((stride * PAGE) as usize) {
                        self.target
                            .pagemap(a, a + PAGE, &mut one)
                            .map_err(|e| io::Error::other(format!("{e:#}")))?;
                        if one
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
                        return Ok(st.finish(false));
                    }
                    addrs.clear();
                    addrs.extend(batch.iter().copied().filter(|a| !st.covered(*a, *a + PAGE)));
                    if addrs.is_empty() {
                        continue;
                    }
                    let read = match self.target.gather(&addrs, sample_len, &mut buf) {
                        Ok(n) => n,
                        Err(e) if e.raw_os_error() == Some(libc::EFAULT) => 0,
                        Err(e) => return Err(e),
                    };
                    for (k, &page) in addrs.iter().enumerate().take(read) {
                        if st.covered(page, page + PAGE) {
                            continue;
                        }
                        st.stats.sampled_pages += 1;
                        let s = &buf[k * sample_len..(k + 1) * sample_len];
                        cands.clear();
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
                                    cands.push((p, at - m));
                                }
                            });
                        }
                        for &(p, a) in &cands {
                            self.consider(&mut st, &pm, r, ri, p, a)?;
                        }
                    }
                }
                w0 = w1;
            }
        }
        if let (Some(p), Some(last)) = (self.progress, regions.last()) {
            p.add_done(last.end - last.start);
        }
        Ok(st.finish(true))
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
        let span = self.span(p);
        let Some((bytes, whole)) = self.compare().confirm(
            &mut st.buf,
            pm,
            &Placed {
                region: r,
                span,
                addr: a,
                lo,
                hi,
            },
        )?
        else {
            st.stats.rejected += 1;
            return Ok(());
        };
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
    fn span(&self, p: usize) -> Span<'_> {
        let piece = &self.grid.pieces[p];
        Span {
            bytes: &self.grid.files[piece.file].bytes,
            kind: piece.kind,
            file_offset: piece.file_offset,
            mem_len: piece.mem_len,
        }
    }

    fn compare(&self) -> Compare<'_> {
        Compare {
            target: self.target,
            stride: self.stride,
            exact: self.exact,
        }
    }
}

/// `[lo, hi)` cut at page boundaries: `(x, y)` for each page it touches.
fn page_chunks(lo: u64, hi: u64) -> impl Iterator<Item = (u64, u64)> {
    let mut x = lo;
    std::iter::from_fn(move || {
        (x < hi).then(|| {
            let y = ((x / PAGE + 1) * PAGE).min(hi);
            let chunk = (x, y);
            x = y;
            chunk
        })
    })
}

/// A piece of a file (a tensor, or a run of an opaque file) as comparisons need it.
#[derive(Clone, Copy)]
pub struct Span<'a> {
    pub bytes: &'a FileBytes,
    pub kind: CopyKind,
    pub file_offset: u64,
    /// Its length in memory: the file's bytes times the kind's factor (widened copies
    /// are larger).
    pub mem_len: u64,
}

/// Where a copy of a span lies: it starts at `addr` (possibly outside the region), and
/// `[lo, hi)` is its part inside `region`.
pub struct Placed<'a> {
    pub region: &'a Region,
    pub span: Span<'a>,
    pub addr: u64,
    pub lo: u64,
    pub hi: u64,
}

impl<'a> Placed<'a> {
    fn parts(&self) -> (&'a Region, Span<'a>, u64, u64, u64) {
        (self.region, self.span, self.addr, self.lo, self.hi)
    }
}

/// Compares a process's memory with a file's bytes: how a candidate copy is confirmed by
/// the search, and how the engine re-checks a copy it found before.
pub struct Compare<'a> {
    pub target: &'a ProcMemory,
    pub stride: u64,
    pub exact: bool,
}

/// Pages of the copies one search found that a check in place compares again, spread
/// over the copies (see [`super::recheck::recheck`]).
pub const SPOT_PAGES: usize = 256;

impl Compare<'_> {
    /// Checks again a whole copy (`at`) that a search confirmed before: `Some(present
    /// bytes)` when every page of it is still present and `pages` of them, evenly spread
    /// from the first to the last, equal the file (none compared with `pages == 0`:
    /// presence only); `None` otherwise (swapped out, freed, unmapped or overwritten).
    /// `pm` holds the page-map entries of the copy.
    pub fn spot_check(
        &self,
        b: &mut Buffers,
        pm: &PageMap,
        at: &Placed,
        pages: usize,
    ) -> io::Result<Option<u64>> {
        let (r, span, a, lo, hi) = at.parts();
        let present: Vec<(u64, u64)> = page_chunks(lo, hi).collect();
        if present.iter().any(|&(x, _)| !pm.eligible(r, x)) {
            return Ok(None);
        }
        let picks = pages.min(present.len());
        for k in 0..picks {
            let i = if picks == 1 {
                0
            } else {
                k * (present.len() - 1) / (picks - 1)
            };
            let (x, y) = present[i];
            if !self.equal(b, &span, a, x, y)? {
                return Ok(None);
            }
        }
        Ok(Some(hi - lo))
    }

    /// Compares `[x, y)` of the target with the file bytes of `span` copied at `a`.
    /// `false` if the memory could not be read.
    fn equal(&self, b: &mut Buffers, span: &Span, a: u64, x: u64, y: u64) -> io::Result<bool> {
        let factor = span.kind.factor();
        // Widened copies are compared in whole elements (4 bytes in memory).
        let (x, y) = if factor > 1 {
            (a + (x - a) / 4 * 4, a + (y - a).div_ceil(4) * 4)
        } else {
            (x, y)
        };
        let y = y.min(a + span.mem_len);
        let n = (y - x) as usize;
        b.mem.resize(n, 0);
        let got = match self.target.read(x, &mut b.mem) {
            Ok(g) => g,
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => 0,
            Err(e) => return Err(e),
        };
        if got != n {
            return Ok(false);
        }
        b.src.resize(n / factor as usize, 0);
        span.bytes
            .read_exact_at(&mut b.src, span.file_offset + (x - a) / factor)?;
        span.kind.convert(&b.src, &mut b.conv);
        b.compared_bytes += n as u64;
        Ok(b.mem == b.conv)
    }

    /// Confirms a candidate copy (`at`): `Some((credited present bytes, whole))` or
    /// `None`. `pm` may hold the region's page-map entries (else the copy's own are read).
    pub fn confirm(
        &self,
        b: &mut Buffers,
        pm: &PageMap,
        at: &Placed,
    ) -> io::Result<Option<(u64, bool)>> {
        let (r, span, a, lo, hi) = at.parts();
        // A sparsely sampled region: the copy's own pages' entries.
        let local;
        let pm = if !pm.covers(lo, hi) {
            local = PageMap::read_entries(self.target, lo / PAGE * PAGE, hi)?;
            &local
        } else {
            pm
        };
        let len = span.mem_len;
        let end = hi;
        let clipped = lo != a || hi != a + len;
        // Page-sized chunks of the copy: [x, y) with its eligibility.
        let chunks: Vec<(u64, u64, bool)> = page_chunks(lo, end)
            .map(|(x, y)| (x, y, pm.eligible(r, x)))
            .collect();
        let present: u64 = chunks.iter().filter(|c| c.2).map(|c| c.1 - c.0).sum();
        if present < PAGE.min(len) {
            return Ok(None);
        }
        let last = chunks.len() - 1;
        let sparse = !self.exact && chunks.len() > 16;
        let mut all = true;
        for (i, &(x, y, ok)) in chunks.iter().enumerate() {
            if !ok {
                continue;
            }
            let on_stride = i == 0 || i == last || (x / PAGE) % self.stride.max(1) == 0;
            if sparse && !on_stride {
                continue;
            }
            if !self.equal(b, &span, a, x, y)? {
                all = false;
                break;
            }
        }
        if all && !clipped {
            return Ok(Some((present, true)));
        }
        // A partial copy: credit the pages that match and carry information.
        let mut credited = 0u64;
        for &(x, y, ok) in &chunks {
            if ok && self.equal(b, &span, a, x, y)? && !b.mem.chunks_exact(WIN).all(periodic) {
                credited += y - x;
            }
        }
        Ok((credited >= PAGE).then_some((credited, false)))
    }
}

//! Comparing a process's memory with a file's bytes: how the search confirms a candidate
//! copy ([`Compare::confirm`]) and how the engine checks a copy it found before
//! ([`Compare::spot_check`]). Only present pages are read (the page map says which).

use std::io;

use super::chunkmemo;
use super::filebytes::FileBytes;
use super::grid::{PAGE, WIN};
use super::index::{periodic, Convert, CopyKind};
use super::pagemap::PageMap;
use super::transform::{expected, Grouped};
use crate::collect::memory::{ProcMemory, Region};

/// Scratch space of comparisons, and the bytes they compared.
#[derive(Default)]
pub struct Buffers {
    mem: Vec<u8>,
    src: Vec<u8>,
    conv: Vec<u8>,
    pub compared_bytes: u64,
    /// The chunks compared now lie far apart (a spot check): each is read from the file
    /// alone, not with the block around it.
    sparse: bool,
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
    /// Its length in memory: the file's bytes as the kind converts them (widened copies
    /// are larger, narrowed ones smaller).
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

/// A copy's pages are compared whole at most this many pages apart (with its first and
/// last page), whatever the search's sampling stride: sampling more sparsely (fewer reads
/// to find a copy) never confirms one more loosely.
pub const CONFIRM_STRIDE: u64 = 63;

/// Compares a process's memory with a file's bytes: how a candidate copy is confirmed by
/// the search, and how the engine re-checks a copy it found before.
pub struct Compare<'a> {
    pub target: &'a ProcMemory,
    /// The search's sampling stride (pages); confirmation uses it up to [`CONFIRM_STRIDE`].
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
        if !pm.all_eligible(r, lo, hi) {
            return Ok(None);
        }
        // The page-sized chunks of [lo, hi) (as `page_chunks`), picked by index.
        let chunks = (hi.div_ceil(PAGE) - lo / PAGE) as usize;
        let chunk = |i: usize| {
            let page = (lo / PAGE + i as u64) * PAGE;
            (page.max(lo), (page + PAGE).min(hi))
        };
        let picks = pages.min(chunks);
        b.sparse = true;
        let mut all = Ok(Some(hi - lo));
        for k in 0..picks {
            let i = if picks == 1 {
                0
            } else {
                k * (chunks - 1) / (picks - 1)
            };
            let (x, y) = chunk(i);
            match self.equal(b, &span, a, x, y) {
                Ok(true) => {}
                Ok(false) => {
                    all = Ok(None);
                    break;
                }
                Err(e) => {
                    all = Err(e);
                    break;
                }
            }
        }
        b.sparse = false;
        all
    }

    /// Compares `[x, y)` of the target with the file bytes of `span` copied at `a`.
    /// `false` if the memory could not be read.
    fn equal(&self, b: &mut Buffers, span: &Span, a: u64, x: u64, y: u64) -> io::Result<bool> {
        // Converted copies are compared in whole elements (of their dtype in memory).
        let (_, elem) = span.kind.elements();
        let (x, y) = if elem > 1 {
            (a + (x - a) / elem * elem, a + (y - a).div_ceil(elem) * elem)
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
            b.mem.truncate(got);
            return Ok(false);
        }
        let kind = span.kind;
        // (A grouped kind's memory offsets key its hashes: a tile may be larger than the
        // file bytes it is made of, so file offsets of two chunks could coincide.)
        let (off, len) = if kind.grouped() {
            (span.file_offset + (x - a), n)
        } else {
            (
                span.file_offset + kind.file_bytes(x - a),
                kind.file_bytes(n as u64) as usize,
            )
        };
        b.compared_bytes += n as u64;
        // The file's bytes of this chunk were read before: compare with their hash.
        let version = &span.bytes.version;
        if let Some(h) = chunkmemo::get(version, off, len, span.kind) {
            return Ok(chunkmemo::hash(&b.mem) == h);
        }
        if kind.grouped() {
            // Interleaved rows: the output blocks of [x, y), each made from its rows.
            b.conv.resize(n, 0);
            expected(
                kind,
                span.bytes,
                span.file_offset,
                x - a,
                &mut b.src,
                &mut b.conv,
            )?;
        } else {
            b.src.resize(len, 0);
            if b.sparse {
                span.bytes.read_exact_at_alone(&mut b.src, off)?;
            } else {
                span.bytes.read_exact_at(&mut b.src, off)?;
            }
            span.kind.convert(&b.src, &mut b.conv);
        }
        chunkmemo::put(version, off, len, span.kind, chunkmemo::hash(&b.conv));
        Ok(b.mem == b.conv)
    }

    /// Bytes of `[x, y)` (read by [`Compare::equal`] into `b.mem`) in 16-byte windows of
    /// the identical copy at `a` that equal the file and carry information.
    fn equal_windows(
        &self,
        b: &mut Buffers,
        span: &Span,
        a: u64,
        x: u64,
        y: u64,
    ) -> io::Result<u64> {
        let y = y.min(a + span.mem_len);
        let n = (y - x) as usize;
        if b.mem.len() != n {
            return Ok(0);
        }
        b.src.resize(n, 0);
        span.bytes
            .read_exact_at(&mut b.src, span.file_offset + (x - a))?;
        // Windows aligned on the copy's start.
        let skip = ((WIN as u64 - (x - a) % WIN as u64) % WIN as u64) as usize;
        let equal = b.mem[skip.min(n)..]
            .chunks_exact(WIN)
            .zip(b.src[skip.min(n)..].chunks_exact(WIN))
            .filter(|(m, f)| m == f && !periodic(m))
            .count();
        Ok((equal * WIN) as u64)
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
        let step = self.stride.clamp(1, CONFIRM_STRIDE);
        for (i, &(x, y, ok)) in chunks.iter().enumerate() {
            if !ok {
                continue;
            }
            let on_stride = i == 0 || i == last || (x / PAGE) % step == 0;
            if sparse && !on_stride {
                continue;
            }
            // A stop asked (SIGTERM to serve or record): the copy is left unconfirmed.
            if crate::collect::stop::stopping() {
                return Ok(None);
            }
            if !self.equal(b, &span, a, x, y)? {
                all = false;
                break;
            }
        }
        if all && !clipped {
            return Ok(Some((present, true)));
        }
        // A partial copy: credit the pages that match and carry information, and in a
        // page that does not, its 16-byte windows (of the copy) that do: a freed buffer
        // written over in part still holds the rest of the file's bytes.
        let mut credited = 0u64;
        for &(x, y, ok) in &chunks {
            if !ok {
                continue;
            }
            if crate::collect::stop::stopping() {
                return Ok(None);
            }
            if self.equal(b, &span, a, x, y)? {
                if !b.mem.chunks_exact(WIN).all(periodic) {
                    credited += y - x;
                }
            } else if span.kind == CopyKind::Identical {
                credited += self.equal_windows(b, &span, a, x, y)?;
            }
        }
        Ok((credited >= PAGE).then_some((credited, false)))
    }
}

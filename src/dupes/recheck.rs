//! A check in place of the copies an earlier search found: cheaper than a new search,
//! and it can only undercount (see [`recheck`]).

use super::filebytes::FileBytes;
use super::grid::PAGE;
use super::opening::open_path;
use super::prove::{credit, Found, Proof};
use super::sweep::{Buffers, Compare, PageMap, Placed, Span};
use crate::collect::memory::ProcMemory;
use crate::collect::Roots;
use crate::sample::{ProofSample, Sample};

/// What a check in place found.
#[derive(Debug)]
pub enum Rechecked {
    /// Every copy the search found is still there, as far as the check looked.
    Still(Box<Proof>),
    /// A copy is gone or differs: the process must be searched again.
    Changed,
}

/// Checks the copies an earlier search of `proof.sample.pid` found, in place, at a cost
/// that grows little with their size: every page of every whole copy is still present
/// (one page-map read per region) and [`super::sweep::SPOT_PAGES`] pages in all, spread
/// over the copies and within each from its first page to its last, still equal the file
/// ([`Compare::spot_check`]). Any page missing or different: [`Rechecked::Changed`].
/// Partial copies are not kept (which of their pages matched is not known): the result
/// can only undercount. Memory the process allocated since is not searched: the caller
/// says so.
pub fn recheck(
    roots: &Roots,
    sample: &Sample,
    proof: &Proof,
    exact: bool,
) -> Result<Rechecked, String> {
    let pid = proof.sample.pid;
    let mut out = Proof {
        sample: ProofSample {
            pid,
            file: proof.sample.file,
            unsearched: proof.sample.unsearched.clone(),
            searchable_fraction: proof.sample.searchable_fraction,
            stride_pages: proof.sample.stride_pages,
            ..ProofSample::default()
        },
        found: Vec::new(),
        took: proof.took,
    };
    let mut whole: Vec<&Found> = proof.found.iter().filter(|f| f.whole).collect();
    if whole.is_empty() {
        return Ok(Rechecked::Still(Box::new(out)));
    }
    whole.sort_by_key(|f| (f.region.start, f.addr));
    let key = proof.sample.file;
    let Some(f) = sample.files.iter().find(|f| f.key == key) else {
        return Ok(Rechecked::Changed);
    };
    if let Some(why) = &f.unopened {
        return Err(format!("not checked: {why}"));
    }
    let target = ProcMemory::open(&roots.proc, pid).map_err(|e| format!("{e:#}"))?;
    let path = open_path(sample, key, &f.path, &roots.proc);
    let bytes = FileBytes::open(&path).map_err(|e| super::filebytes::cannot(&path, &e))?;
    let compare = Compare {
        target: &target,
        stride: proof.sample.stride_pages.max(1),
        exact,
    };
    let part = Found::part;
    let failed = |e: std::io::Error| format!("cannot check pid {pid} again: {e}");
    let spot = super::sweep::SPOT_PAGES;
    let every = whole.len().div_ceil(spot);
    let pages = (spot / whole.len().div_ceil(every)).max(1);
    let mut buf = Buffers::default();
    let mut pm = PageMap::default();
    let mut pm_region = None;
    for (i, found) in whole.iter().enumerate() {
        let r = &found.region;
        if pm_region != Some(r.start) {
            let same = whole[i..].iter().take_while(|f| f.region.start == r.start);
            let (lo, hi) = same.fold((u64::MAX, 0), |(lo, hi), f| {
                let (a, b) = part(f);
                (lo.min(a), hi.max(b))
            });
            // PAGEMAP_SCAN's ranges where the kernel has it: 8 bytes of pagemap per page
            // of gigabytes of copies cost 90 ms a minute on the bench host.
            let (from, to) = (lo / PAGE * PAGE, hi.next_multiple_of(PAGE));
            let again = |e: std::io::Error| format!("cannot check pid {pid} again: {e:#}");
            pm = match PageMap::scan(&target, from, to, r.kind).map_err(again)? {
                Some(scanned) => scanned,
                None => PageMap::read_entries(&target, from, hi).map_err(again)?,
            };
            pm_region = Some(r.start);
        }
        let span = Span {
            bytes: &bytes,
            kind: found.kind,
            file_offset: found.file_offset,
            mem_len: found.mem_len,
        };
        let (lo, hi) = part(found);
        let check = if i % every == 0 { pages } else { 0 };
        match compare
            .spot_check(
                &mut buf,
                &pm,
                &Placed {
                    region: r,
                    span,
                    addr: found.addr,
                    lo,
                    hi,
                },
                check,
            )
            .map_err(failed)?
        {
            Some(mem_bytes) => {
                credit(&mut out.sample, key, found.kind, r, mem_bytes);
                out.found.push((*found).clone());
            }
            None => return Ok(Rechecked::Changed),
        }
    }
    out.sample.compared_bytes = buf.compared_bytes;
    Ok(Rechecked::Still(Box::new(out)))
}

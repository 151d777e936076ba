//! The proof behind the count: search every candidate's memory for copies of the files
//! of interest with one [`Grid`], within a time budget, in parallel.
//!
//! Each candidate process is searched once for all files (one pass over its memory).
//! A copy found inside the process's own private mapping of the same file is that
//! mapping's copy-on-write pages: reported as such, never as another copy. Whatever is not
//! searched (no permission, gone, over the budget, nothing searchable in the file) is
//! reported with the reason, so the count can say it is a lower bound.

use crate::sample::{Warning, WarningKind};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::grid::{Grid, PAGE};
use super::index::Layouts;
use super::indexcache::{self, IndexCache};
use super::likeness::Likeness;
use super::opening::{open_all, open_path_stat};
use super::pointcache::PointCache;
use super::prove_parts::{grid_index, proof_for, searchable_fraction};
use super::sweep::{Sweep, SweepStats};
use super::twins::same_bytes;
use crate::collect::memory::{ProcMemory, Region};
use crate::collect::Roots;
use crate::sample::unsearched::Unsearched;
use crate::sample::{FileKey, ProofSample, Sample};

/// Where they were defined first (the engine names them so).
/// Where it was defined first (`top`'s collector and screen name it so).
pub use super::Progress;

/// How to prove.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProveOptions {
    /// Stop starting new searches after this long; `None`: no limit.
    pub budget: Option<Duration>,
    /// Compare every page of every copy and sample every page (as `dupes` does).
    pub exact: bool,
}

impl Default for ProveOptions {
    fn default() -> Self {
        ProveOptions {
            budget: Some(Duration::from_secs(5)),
            exact: false,
        }
    }
}

/// A file to search for, and how to open it.
pub struct ProofFile {
    pub key: FileKey,
    pub open_path: PathBuf,
}

/// Outcome of one process's search.
struct Searched {
    pid: i32,
    result: Result<(super::sweep::Outcome, Vec<Region>), Unsearched>,
    took: Duration,
}

pub use super::found::{credit, Found, KnownCopies, Proof};

/// Searches the sample's candidates; one [`ProofSample`] per (candidate, file) pair, and
/// one per (process, file) where a copy was found beyond the candidacy. Candidates are
/// grouped by the set of files they could hold a copy of, and each group is searched with
/// a grid of its own files only: a file twofold cannot parse (searched densely, at every
/// byte alignment) never slows the search of processes that could not hold it.
pub fn prove(
    roots: &Roots,
    sample: &Sample,
    opts: ProveOptions,
    warnings: &mut Vec<Warning>,
) -> Vec<ProofSample> {
    prove_with(roots, sample, opts, None, warnings)
}

/// [`prove`], reporting its progress to (and stopping when cancelled through) `progress`.
pub fn prove_with(
    roots: &Roots,
    sample: &Sample,
    opts: ProveOptions,
    progress: Option<&Progress>,
    warnings: &mut Vec<Warning>,
) -> Vec<ProofSample> {
    prove_found(roots, sample, opts, progress, warnings)
        .into_iter()
        .map(|p| p.sample)
        .collect()
}

/// [`prove_with`], keeping where each copy was found (for [`recheck`]).
pub fn prove_found(
    roots: &Roots,
    sample: &Sample,
    opts: ProveOptions,
    progress: Option<&Progress>,
    warnings: &mut Vec<Warning>,
) -> Vec<Proof> {
    prove_cached(roots, sample, opts, progress, warnings, None, None)
}

/// [`prove_found`], taking the files' index from `cache` when it holds one of these
/// versions of them (and keeping the one it builds there).
pub fn prove_cached(
    roots: &Roots,
    sample: &Sample,
    opts: ProveOptions,
    progress: Option<&Progress>,
    warnings: &mut Vec<Warning>,
    mut cache: Option<&mut IndexCache>,
    known: Option<&KnownCopies>,
) -> Vec<Proof> {
    let start = Instant::now();
    let deadline = opts.budget.map(|b| start + b);
    let groups = super::prove_parts::groups(sample, search_order(sample));
    let mut out = Vec::new();
    // The groups share the points of the files they have in common, and later runs
    // take them from disk ([`super::pointcache`]).
    let points = PointCache::new();
    for (files, pids) in groups {
        out.extend(prove_group(
            roots,
            sample,
            &files,
            &pids,
            opts,
            deadline,
            progress,
            warnings,
            (cache.as_deref_mut(), &points),
            known,
        ));
    }
    if std::env::var_os("TWOFOLD_PROFILE").is_some() {
        let (taken, read) = points.stats.lock().map(|s| *s).unwrap_or_default();
        let (kept, hits, misses) = super::chunkmemo::stats();
        eprintln!(
            "twofold: proof: {:.3} s in all; points of {taken} files taken from the cache, of {read} read; file chunks compared by hash {hits}, read {misses} ({kept} kept)",
            start.elapsed().as_secs_f64()
        );
    }
    out.sort_by_key(|p| (p.sample.file, p.sample.pid));
    out
}

/// Candidates of the files named on twofold's command line first, then those whose
/// command line names a file, holders, readers; cheapest first within each, so that a
/// budget runs out on as few candidates as possible.
fn search_order(sample: &Sample) -> Vec<i32> {
    let explicit: BTreeSet<FileKey> = sample
        .files
        .iter()
        .filter(|f| f.explicit)
        .map(|f| f.key)
        .collect();
    let mut order: Vec<(i32, (bool, u8, u64))> = Vec::new();
    for c in &sample.candidates {
        // A process whose command line names the model (`llama-server -m x.gguf`) is
        // the likeliest loader; then holders (build tools hold `.bin` files too), then
        // readers.
        let why = match c.why {
            crate::sample::CandidateWhy::Named => 0,
            crate::sample::CandidateWhy::Holder => 1,
            crate::sample::CandidateWhy::Read => 2,
            crate::sample::CandidateWhy::SharedMemory => 3,
            crate::sample::CandidateWhy::Unknown => 4,
        };
        let rank = (!explicit.contains(&c.file), why, c.private_anon_bytes);
        match order.iter_mut().find(|o| o.0 == c.pid) {
            Some(o) => o.1 = o.1.min(rank),
            None => order.push((c.pid, rank)),
        }
    }
    order.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    order.into_iter().map(|o| o.0).collect()
}

/// Indexes `wanted` and searches `pids` (in that order) until the deadline.
#[allow(clippy::too_many_arguments)]
fn prove_group(
    roots: &Roots,
    sample: &Sample,
    wanted: &BTreeSet<FileKey>,
    pids: &[i32],
    opts: ProveOptions,
    deadline: Option<Instant>,
    progress: Option<&Progress>,
    warnings: &mut Vec<Warning>,
    (mut cache, points): (Option<&mut IndexCache>, &PointCache),
    known: Option<&KnownCopies>,
) -> Vec<Proof> {
    let start = Instant::now();
    if deadline.is_some_and(|d| start >= d) || crate::collect::stop::stopping() {
        let why = Unsearched::over_budget(opts.budget.unwrap_or_default().as_secs_f64());
        return unsearched(sample, pids, &why);
    }
    // Where each file is, and its version there: a long-running engine keeps the index
    // of each version of the files ([`IndexCache`]), and then opens none of them.
    // Never a file the collection did not open ([`super::opening::not_opened`]).
    let (mut files, skipped): (Vec<_>, Vec<_>) = sample
        .files
        .iter()
        .filter(|f| wanted.contains(&f.key))
        .partition(|f| f.unopened.is_none());
    // By key, never by naming: tensor bytes two files share are credited to the first
    // file's piece (`model::relation` moves a copy of twins to its process's file).
    files.sort_by_key(|f| f.key);
    let files: Vec<_> = files
        .into_iter()
        .map(|f| (f, open_path_stat(sample, f.key, &f.path, &roots.proc)))
        .collect();
    let stated: Option<Vec<indexcache::Version>> = files
        .iter()
        .map(|(f, (_, m))| m.as_ref().map(|m| indexcache::version(f.key, m)))
        .collect();
    let kept = match (cache.as_deref_mut(), stated) {
        (Some(c), Some(v)) => c.get(&v, opts.exact),
        _ => None,
    };
    // Else open each file (and check it is still that inode), then parse and index them
    // once per version of them.
    let (opened, mut unopened) = match kept {
        Some(_) => Default::default(),
        None => open_all(&files),
    };
    unopened.extend(super::opening::not_opened(&skipped));
    let versions: Vec<indexcache::Version> = opened.iter().map(|o| o.0).collect();
    // (A file that could not be `stat`ed by its path may still have opened.)
    let kept = kept.or_else(|| {
        let c = cache.as_deref_mut().filter(|_| !opened.is_empty())?;
        c.get(&versions, opts.exact)
    });
    let indexed = match kept {
        Some(ix) => ix,
        None => {
            let mut keys = Vec::new();
            let mut inputs = Vec::new();
            for (v, b, path) in opened {
                match crate::container::parse(&b) {
                    Ok(c) => {
                        keys.push(v.0);
                        inputs.push((b, c.tensors, c.format));
                    }
                    Err(e) => {
                        let e = format!("cannot parse '{}': {e}", path.display());
                        unopened.insert(v.0, Unsearched::from_error(e));
                    }
                }
            }
            // Files of the same bytes (a /dev/shm copy of a model beside it): one is
            // indexed, the one not in shared memory, so a copy found is the original's;
            // the other is searched as it (its candidates' copies count under the original).
            let aliases = same_bytes(&mut keys, &mut inputs);
            let grid = match Grid::build_cached(
                inputs,
                16,
                Layouts::Converted,
                opts.exact,
                Some(points),
            ) {
                Ok(g) => g,
                Err(e) => {
                    warnings.push(Warning::host(
                        WarningKind::IndexFailed,
                        format!("cannot index the model files: {e}"),
                    ));
                    return unsearched(sample, pids, &Unsearched::not_indexed(&e.to_string()));
                }
            };
            let likeness = Likeness::of(&grid);
            let ix = std::sync::Arc::new(indexcache::Indexed {
                likeness,
                grid,
                keys,
                aliases,
            });
            // Kept only when every file parsed and read (a file whose filesystem did not
            // answer is read again next time): a hit must give the same outcome.
            let whole = unopened.is_empty() && ix.grid.files.iter().all(|f| f.error.is_none());
            if let (Some(c), true) = (cache, whole) {
                c.put(versions, opts.exact, ix.clone());
            }
            ix
        }
    };
    let (grid, keys, aliases) = (&indexed.grid, &indexed.keys, &indexed.aliases);
    // Each file's byte distribution, for memory like it that no copy found covers.
    let likeness = &indexed.likeness;
    let stride = grid.stride;
    let indexed = start.elapsed();
    let searchable: Vec<f64> = (0..grid.files.len())
        .map(|fi| searchable_fraction(grid, fi))
        .collect();

    let self_pid = std::process::id() as i32;
    // Processes are searched side by side, and each one's windows of memory on the
    // threads left: one large candidate gets every core.
    let outer = crate::collect::proof_threads().min(pids.len()).max(1);
    let inner = (crate::collect::proof_threads() / outer).max(1);
    let search = |pid: i32, carried: &[super::family::Carried]| {
        if pid == self_pid {
            return None;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) || crate::collect::stop::stopping() {
            return Some(Searched {
                pid,
                result: Err(Unsearched::over_budget(
                    opts.budget.unwrap_or_default().as_secs_f64(),
                )),
                took: Duration::ZERO,
            });
        }
        let began = Instant::now();
        // Copies known in place, and those of its family's first on the same frames: the
        // search passes over both.
        let mut known = known
            .and_then(|k| k.get(&pid))
            .map_or(&[][..], Vec::as_slice)
            .to_vec();
        known.extend(carried.iter().map(|c| (c.lo, c.hi)));
        let prefer = super::prove_parts::came_to(sample, pid, keys);
        let mut result = search_one(
            roots,
            grid,
            pid,
            stride,
            opts.exact,
            deadline,
            progress,
            (inner, &known, likeness, &prefer),
        )
        .map_err(Unsearched::from_error);
        if let Ok((outcome, regions)) = result.as_mut() {
            outcome
                .hits
                .extend(super::family::as_hits(carried, regions));
        }
        // A process that exited holds no memory: searched, nothing there.
        if result.is_err() && !roots.proc.join(pid.to_string()).exists() {
            result = Ok((
                super::sweep::Outcome {
                    hits: Vec::new(),
                    stats: SweepStats::default(),
                    complete: true,
                    liked: Vec::new(),
                },
                Vec::new(),
            ));
        }
        Some(Searched {
            pid,
            result,
            took: began.elapsed(),
        })
    };
    // A search that panics loses that process's proof, not the others'.
    let run = |list: &[(i32, Vec<super::family::Carried>)]| -> Vec<Searched> {
        crate::collect::par_map_on(outer.min(list.len()).max(1), list, |(pid, carried)| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| search(*pid, carried)))
                .ok()
                .flatten()
        })
        .into_iter()
        .flatten()
        .collect()
    };
    // One search per physical frame: the first of each fork family, then the others,
    // which pass over the copies they share with it frame for frame.
    let families = super::family::of(&roots.proc, pids);
    let first: Vec<_> = families.first.iter().map(|&p| (p, Vec::new())).collect();
    let mut searched = run(&first);
    let later: Vec<_> = families
        .later
        .iter()
        .map(|&(pid, of)| {
            let carried = searched
                .iter()
                .find(|s| s.pid == of)
                .and_then(|s| s.result.as_ref().ok())
                .map(|(o, regions)| {
                    super::family::carried(&roots.proc, grid, of, &o.hits, regions, pid)
                })
                .unwrap_or_default();
            (pid, carried)
        })
        .collect();
    searched.extend(run(&later));

    // The search is done with the files: twofold maps none of their pages any more (a kept
    // index keeps its files open).
    for f in &grid.files {
        f.bytes.release();
    }
    if std::env::var_os("TWOFOLD_PROFILE").is_some() {
        eprintln!(
            "twofold: proof of {} files in {} processes {:?}: index {:.3} s ({} points, stride {}, pairs every {} pages), search {:.3} s",
            wanted.len(),
            pids.len(),
            &pids[..pids.len().min(4)],
            indexed.as_secs_f64(),
            grid.points(),
            stride,
            grid.every,
            (start.elapsed() - indexed).as_secs_f64()
        );
    }
    let mut out = Vec::new();
    for s in searched {
        let files_of_pid: BTreeSet<FileKey> = sample
            .candidates
            .iter()
            .filter(|c| c.pid == s.pid)
            .map(|c| c.file)
            .collect();
        let took = s.took;
        let bare = |key: FileKey, why: &Unsearched| Proof {
            sample: ProofSample {
                pid: s.pid,
                file: key,
                unsearched: Some(why.clone()),
                ..ProofSample::default()
            },
            found: Vec::new(),
            took,
        };
        match s.result {
            Err(why) => {
                for key in files_of_pid {
                    out.push(bare(key, &why));
                }
            }
            Ok((outcome, regions)) => {
                let super::sweep::Outcome {
                    hits,
                    stats,
                    complete,
                    liked,
                } = outcome;
                let fresh = |key: FileKey, fi: usize| Proof {
                    sample: proof_for(s.pid, key, fi, &searchable),
                    found: Vec::new(),
                    took,
                };
                let mut per: BTreeMap<usize, Proof> = BTreeMap::new();
                for (fi, key) in keys.iter().enumerate() {
                    if files_of_pid.contains(key) {
                        per.insert(fi, fresh(*key, fi));
                    }
                }
                for h in &hits {
                    let piece = &grid.pieces[h.piece];
                    let key = keys[piece.file];
                    let p = per
                        .entry(piece.file)
                        .or_insert_with(|| fresh(key, piece.file));
                    let r = &regions[h.region];
                    p.found.push(Found {
                        file: key,
                        kind: piece.kind,
                        file_offset: piece.file_offset,
                        mem_len: piece.mem_len,
                        addr: h.addr,
                        region: r.clone(),
                        whole: h.whole,
                    });
                    credit(&mut p.sample, key, piece.kind, r, h.mem_bytes);
                }
                // Memory like each file that no copy covers: an estimate, by the pages
                // each sample stands for.
                if std::env::var_os("TWOFOLD_PROFILE").is_some() {
                    eprintln!(
                        "twofold: pid {}: {} sampled pages like a file, {} copies",
                        s.pid,
                        liked.len(),
                        hits.len()
                    );
                }
                for l in &liked {
                    let key = keys[l.file];
                    let p = per.entry(l.file).or_insert_with(|| fresh(key, l.file));
                    p.sample.unexplained_bytes += l.pages * PAGE;
                    p.sample.unexplained_samples += 1;
                }
                for p in per.values_mut().map(|p| &mut p.sample) {
                    p.stride_pages = stats.stride_pages;
                    p.sampled_bytes = stats.sampled_pages * PAGE;
                    p.compared_bytes = stats.compared_bytes;
                    if let Some(e) = &grid.files[grid_index(keys, p.file)].error {
                        p.unsearched = Some(Unsearched::from_error(e.clone()));
                    } else if !complete {
                        p.unsearched = Some(Unsearched::partly_over_budget());
                    } else if searchable[grid_index(keys, p.file)] == 0.0 {
                        p.unsearched = Some(Unsearched::nothing_searchable());
                    }
                }
                // A file of the same bytes as an indexed one: searched as that one.
                for (alias, of) in aliases {
                    if files_of_pid.contains(alias) {
                        let fi = grid_index(keys, *of);
                        out.push(Proof {
                            sample: proof_for(s.pid, *alias, fi, &searchable),
                            found: Vec::new(),
                            took,
                        });
                    }
                }
                out.extend(per.into_values());
            }
        }
    }
    // Candidates of files that could not be opened or parsed.
    for c in sample.candidates.iter().filter(|c| pids.contains(&c.pid)) {
        if let Some(why) = unopened.get(&c.file) {
            out.extend(
                unsearched(sample, &[c.pid], why)
                    .into_iter()
                    .filter(|p| p.sample.file == c.file),
            );
        }
    }
    out
}

/// Every candidacy of `pids`, not searched, for the reason `why`.
fn unsearched(sample: &Sample, pids: &[i32], why: &Unsearched) -> Vec<Proof> {
    sample
        .candidates
        .iter()
        .filter(|c| pids.contains(&c.pid))
        .map(|c| Proof {
            sample: ProofSample {
                pid: c.pid,
                file: c.file,
                unsearched: Some(why.clone()),
                ..ProofSample::default()
            },
            found: Vec::new(),
            took: Duration::ZERO,
        })
        .collect()
}

type SearchResult = Result<(super::sweep::Outcome, Vec<Region>), String>;

#[allow(clippy::too_many_arguments)]
fn search_one(
    roots: &Roots,
    grid: &Grid,
    pid: i32,
    stride: u64,
    exact: bool,
    deadline: Option<Instant>,
    progress: Option<&Progress>,
    (threads, known, likeness, prefer): (usize, &[(u64, u64)], &Likeness, &[usize]),
) -> SearchResult {
    // The whole chain: the refusal's reason is in the source.
    let target =
        ProcMemory::open(&roots.proc, pid).map_err(|e| format!("{:#}", anyhow::Error::from(e)))?;
    let maps_path = roots.proc.join(pid.to_string()).join("maps");
    let text = std::fs::read_to_string(&maps_path)
        .map_err(|e| format!("cannot read '{}': {e}", maps_path.display()))?;
    let regions = ProcMemory::regions(&maps_path, &text).map_err(|e| format!("{e:#}"))?;
    let sweep = Sweep {
        grid,
        target: &target,
        stride,
        exact,
        deadline,
        progress,
        threads,
        window: super::sweep::WINDOW,
        known,
        likeness: Some(likeness),
        prefer,
    };
    let outcome = sweep.run_all(&regions).map_err(|e| {
        if e.raw_os_error() == Some(libc::ESRCH) {
            "the process exited while it was searched".to_string()
        } else {
            format!("cannot search pid {pid}: {e}")
        }
    })?;
    Ok((outcome, regions))
}

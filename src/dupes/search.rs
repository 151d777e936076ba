//! `twofold dupes`'s search: the files prepared (opened once, parsed, their residency
//! read), one [`Grid`] over all of them, each process swept with it, and the copies
//! found weighed by who maps their pages ([`super::physical`]).

use crate::sample::{Warning, WarningKind};
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::collect::gather::{self, Request};
use crate::collect::memory::{ProcMemory, Region, RegionKind};
use crate::collect::process::ProcReader;
use crate::collect::residency;
use crate::collect::Roots;
use crate::container::{Container, Format};
use crate::model::dupes::{
    file_dupes, summarize, DupesReport, FileDupes, HitIn, ProcessDupes, Searched,
};
use crate::sample::FileKey;

use super::filebytes::FileBytes;
use super::grid::Grid;
use super::index::{CopyKind, Layouts};
use super::sweep::Sweep;

/// A file prepared for searching: opened once (the inode parsed is the inode searched for).
struct Prepared {
    path: String,
    key: FileKey,
    size: u64,
    container: Container,
    page_cache: Option<f64>,
}

fn prepare(shown: &str, open_path: &Path) -> anyhow::Result<(Prepared, FileBytes)> {
    let what = || format!("cannot read '{}'", open_path.display());
    // Asked for by name: opened on FUSE too, where the open drops its page cache, so its
    // residency is read before (and is unknown on FUSE, said by the caller).
    let place = crate::collect::answer::Place::of(open_path);
    let fuse = crate::collect::answer::is_fuse(place, open_path)?;
    // Opened (a regular file only), its holes found and every read made under the
    // deadline: a filesystem that stops answering fails this file, said by its name.
    let bytes = FileBytes::open_even_on_fuse(open_path).with_context(what)?;
    let size = bytes.size;
    let container = crate::container::parse(&bytes).with_context(what)?;
    // The page cache (`cachestat` asks nothing of the filesystem); unknown on FUSE, where
    // the open dropped it.
    let page_cache = (!fuse)
        .then(|| residency::query(bytes.file(), open_path, size, residency::Method::Auto).ok())
        .flatten()
        .map(|r| {
            crate::model::page_cache_fraction(
                r.cached_bytes,
                size,
                crate::collect::system::page_size(),
            )
        });
    Ok((
        Prepared {
            path: shown.to_string(),
            key: bytes.version.0,
            size,
            container,
            page_cache,
        },
        bytes,
    ))
}

/// Files the process maps or holds open (files of interest, as `scan` finds them).
/// A file as shown (the path the process sees) and the path it is opened by.
type ShownPath = (String, PathBuf);

/// The files to search `pid` for when none is named: those it maps or holds, and those
/// of the host's files of interest it could hold a copy of (it read and closed them: its
/// private memory and its reads are large enough), with how many were looked at.
fn files_of(
    roots: &Roots,
    pid: i32,
    out_warnings: &mut Vec<Warning>,
) -> anyhow::Result<(Vec<ShownPath>, Option<crate::sample::HostFiles>)> {
    let req = Request {
        pids: vec![pid],
        host_files: true,
        ..Request::default()
    };
    let mut warnings = Vec::new();
    let sample = gather::gather(roots, &req, &mut warnings)?;
    out_warnings.append(&mut warnings);
    let root = roots.proc.join(pid.to_string()).join("root");
    let files = sample
        .files
        .iter()
        .map(|f| {
            let p = f.path.strip_suffix(" (deleted)").unwrap_or(&f.path);
            (f.path.clone(), root.join(p.trim_start_matches('/')))
        })
        .collect();
    Ok((files, sample.host_files))
}

/// Searches one process with the grid (every page, every copy compared in full) and
/// builds its findings for the files `chosen` (indices into `prepared` and the grid).
fn search_process(
    roots: &Roots,
    pid: i32,
    grid: &Grid,
    prepared: &[Prepared],
    chosen: &[usize],
) -> anyhow::Result<Vec<FileDupes>> {
    let target = ProcMemory::open(&roots.proc, pid)?;
    let maps_path = roots.proc.join(pid.to_string()).join("maps");
    let text = std::fs::read_to_string(&maps_path)
        .with_context(|| format!("failed to read '{}'", maps_path.display()))?;
    let regions: Vec<Region> = ProcMemory::regions(&maps_path, &text)?;
    let sweep = Sweep {
        grid,
        target: &target,
        stride: 1,
        exact: true,
        deadline: None,
        progress: None,
        threads: crate::collect::proof_threads(),
        window: super::sweep::WINDOW,
        known: &[],
        likeness: None,
        prefer: &[],
    };
    let (hits, stats, _) = sweep
        .run(&regions)
        .with_context(|| format!("cannot search '/proc/{pid}/mem'"))?;
    let mut out = Vec::new();
    for &fi in chosen {
        let p = &prepared[fi];
        let gf = &grid.files[fi];
        let mine: Vec<HitIn> = hits
            .iter()
            .filter(|h| grid.pieces[h.piece].file == fi)
            .map(|h| {
                let piece = &grid.pieces[h.piece];
                let r = &regions[h.region];
                HitIn {
                    tensor: piece.tensor,
                    kind: piece.kind,
                    address: h.addr,
                    memory_bytes: h.mem_bytes,
                    region: (r.label.clone(), r.kind, r.start, r.end),
                    own_mapping: r.kind == RegionKind::PrivateFile && r.key == Some(p.key),
                }
            })
            .collect();
        let searchable = grid.pieces.iter().any(|x| {
            x.file == fi
                && !gf
                    .unsearchable
                    .iter()
                    .any(|(t, k, _)| *t == x.tensor && *k == x.kind)
        });
        // A tensor is not searchable when no form of it is (an F16 tensor too small as
        // it is may be searched widened): the counts agree with what is searched.
        let searched: std::collections::HashSet<usize> = grid
            .pieces
            .iter()
            .enumerate()
            .filter(|(i, x)| x.file == fi && grid.informative[*i])
            .map(|(_, x)| x.tensor)
            .collect();
        let unsearchable: Vec<_> = gf
            .unsearchable
            .iter()
            .filter(|(t, k, _)| *k == CopyKind::Identical && !searched.contains(t))
            .copied()
            .collect();
        let file = Searched {
            path: &p.path,
            format: &p.container.format,
            size_bytes: p.size,
            tensors: &gf.tensors,
            unsearchable: &unsearchable,
            searchable,
        };
        out.push(file_dupes(&file, &mine, stats.clone()));
    }
    Ok(out)
}

/// One physical copy counts once, as in `scan`: the pages of the copies found in the
/// processes searched are weighed by who maps them ([`crate::dupes::physical`]).
fn weigh(roots: &Roots, prepared: &[Prepared], processes: &mut [ProcessDupes]) {
    use super::physical::{self, CopyRanges};
    let mut proofs = Vec::new();
    let mut ranges = Vec::new();
    let mut at = Vec::new();
    for (pi, p) in processes.iter().enumerate() {
        for (fi, f) in p.files.iter().enumerate() {
            let Some(key) = prepared.iter().find(|x| x.path == f.path).map(|x| x.key) else {
                continue;
            };
            let r = f
                .copies
                .iter()
                .filter_map(|c| {
                    let region = f
                        .regions
                        .iter()
                        .find(|r| r.start <= c.address && c.address < r.end)?;
                    Some((
                        c.address,
                        (c.address + c.memory_bytes).min(region.end),
                        region.kind,
                    ))
                })
                .collect();
            proofs.push(crate::sample::ProofSample {
                pid: p.pid,
                file: key,
                copy_memory_bytes: f.identical.memory_bytes + f.converted.memory_bytes,
                ..Default::default()
            });
            ranges.push(CopyRanges { ranges: r });
            at.push((pi, fi));
        }
    }
    physical::weigh(&roots.proc, &mut proofs, &ranges);
    for (proof, (pi, fi)) in proofs.iter().zip(at) {
        let Some(w) = &proof.physical else { continue };
        let f = &mut processes[pi].files[fi];
        f.share = w.ratio();
        f.shared_by = w.shared_by;
        if let Some(p) = f.private_copies.as_mut() {
            *p *= f.share;
        }
    }
}

/// What to search: the processes, the files (none: each process's own model files), the
/// alignment copies may start at, and whether to look for tensors converted to another
/// dtype (widened, narrowed, F16 ↔ BF16).
#[derive(Debug, Clone)]
pub struct SearchRequest {
    pub pids: Vec<i32>,
    pub files: Vec<PathBuf>,
    pub align: u64,
    pub widen: bool,
}

/// Searches every process of `args` for copies of the files, each with the grid (every
/// page, every copy compared in full), and weighs the copies found by who maps them.
/// Warnings (a file skipped, a process partly unreadable) go to `warnings`; a process
/// that cannot be searched at all is reported with its error.
pub fn search(
    args: &SearchRequest,
    roots: &Roots,
    warnings: &mut Vec<Warning>,
) -> anyhow::Result<DupesReport> {
    let procs = ProcReader::new(&roots.proc);
    for pid in &args.pids {
        crate::input::check_pid(&roots.proc, *pid)?;
    }
    // Explicit files are validated up front; they apply to every pid.
    let mut prepared: Vec<Prepared> = Vec::new();
    let mut bytes: Vec<FileBytes> = Vec::new();
    for f in &args.files {
        crate::input::check_regular(f, "file")?;
        let shown = std::path::absolute(f).unwrap_or_else(|_| f.clone());
        let (p, b) = prepare(&shown.display().to_string(), f)?;
        prepared.push(p);
        bytes.push(b);
    }
    let explicit = prepared.len();
    let mut chosen_by_pid: Vec<(i32, String, Vec<usize>, Option<crate::sample::HostFiles>)> =
        Vec::new();
    for &pid in &args.pids {
        let comm = procs.status(pid).map(|s| s.comm).unwrap_or_default();
        let mut chosen: Vec<usize> = (0..explicit).collect();
        let mut host = None;
        if explicit == 0 {
            let (files, h) = files_of(roots, pid, warnings)?;
            host = h;
            for (shown, open_path) in files {
                let i = match prepared.iter().position(|p| p.path == shown) {
                    Some(i) => i,
                    None => match prepare(&shown, &open_path) {
                        Ok((p, b)) => {
                            prepared.push(p);
                            bytes.push(b);
                            prepared.len() - 1
                        }
                        Err(e) => {
                            warnings.push(Warning::new(
                                WarningKind::FileSkipped,
                                shown.clone(),
                                format!("skipping '{shown}': {e:#}"),
                            ));
                            continue;
                        }
                    },
                };
                chosen.push(i);
            }
        }
        chosen_by_pid.push((pid, comm, chosen, host));
    }
    let page_cache: Vec<(String, Option<f64>)> = prepared
        .iter()
        .map(|p| (p.path.clone(), p.page_cache))
        .collect();
    let inputs: Vec<(FileBytes, Vec<crate::container::Tensor>, Format)> = bytes
        .into_iter()
        .zip(&prepared)
        .map(|(b, p)| (b, p.container.tensors.clone(), p.container.format.clone()))
        .collect();
    let layouts = if args.widen {
        Layouts::Converted
    } else {
        Layouts::Identical
    };
    let grid =
        Grid::build(inputs, args.align, layouts, true).context("cannot index the model files")?;
    // A file that could not be read whole (its filesystem stopped answering mid-read) is
    // said, never searched in part as if it had no copy.
    let mut read = prepared.iter().zip(&grid.files);
    if let Some((p, e)) = read.find_map(|(p, f)| Some((p, f.error.as_ref()?))) {
        anyhow::bail!("cannot index '{}': {e}", p.path);
    }
    let mut processes = Vec::new();
    for (pid, comm, chosen, host_files) in chosen_by_pid {
        match search_process(roots, pid, &grid, &prepared, &chosen) {
            Ok(files) => processes.push(ProcessDupes {
                pid,
                comm,
                error: None,
                files,
                host_files,
            }),
            Err(e) => processes.push(ProcessDupes {
                pid,
                comm,
                error: Some(format!("{e:#}")),
                files: Vec::new(),
                host_files,
            }),
        }
    }
    weigh(roots, &prepared, &mut processes);
    let files = summarize(&processes, &page_cache);
    Ok(DupesReport {
        schema_version: crate::model::SCHEMA_VERSION,
        processes,
        files,
    })
}

//! `twofold dupes`: byte-level proof of private and widened copies.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::cli::DupesArgs;
use crate::collect::gather::{self, Request};
use crate::collect::memory::{Region, Target};
use crate::collect::process::ProcReader;
use crate::collect::residency;
use crate::collect::Roots;
use crate::container::{Container, Format, Tensor};
use crate::dupes::index::Index;
use crate::dupes::search;
use crate::model::dupes::{file_dupes, summarize, DupesReport, FileDupes, ProcessDupes};
use crate::render;

/// Opaque files are searched in blocks of this size.
pub const OPAQUE_BLOCK: u64 = 1 << 20;

/// The tensor table to search for: the container's, or 1 MiB blocks of an opaque file.
pub fn searchable_container(path: &Path) -> anyhow::Result<Container> {
    let mut c = crate::container::open(path)
        .with_context(|| format!("cannot read '{}'", path.display()))?;
    if c.format == Format::Opaque {
        c.tensors = (0..c.file_size.div_ceil(OPAQUE_BLOCK))
            .map(|i| {
                let offset = i * OPAQUE_BLOCK;
                Tensor {
                    name: format!("block {i}"),
                    dtype: crate::container::Dtype::U8,
                    shape: vec![],
                    offset,
                    len: OPAQUE_BLOCK.min(c.file_size - offset),
                }
            })
            .collect();
    }
    Ok(c)
}

/// A file prepared for searching: opened, parsed, indexed once for all processes.
struct Prepared {
    path: String,
    file: std::fs::File,
    container: Container,
    index: Index,
    page_cache: Option<f64>,
}

fn prepare(shown: &str, open_path: &Path, widen: bool) -> anyhow::Result<Prepared> {
    let container = searchable_container(open_path)?;
    let (file, size) = residency::open(open_path)?;
    let index = Index::build(&file, &container.tensors, widen)
        .with_context(|| format!("cannot index '{}'", open_path.display()))?;
    let page_cache = residency::query(&file, open_path, size, residency::Method::Auto)
        .ok()
        .map(|r| {
            let page = crate::collect::system::page_size();
            let pages = size.div_ceil(page).max(1);
            (r.cached_bytes / page) as f64 / pages as f64
        });
    Ok(Prepared {
        path: shown.to_string(),
        file,
        container,
        index,
        page_cache,
    })
}

/// Files the process maps or holds open (files of interest, as `scan` finds them).
fn files_of(roots: &Roots, pid: i32) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let req = Request {
        pids: vec![pid],
        ..Request::default()
    };
    let mut warnings = Vec::new();
    let sample = gather::gather(roots, &req, &mut warnings)?;
    let root = roots.proc.join(pid.to_string()).join("root");
    Ok(sample
        .files
        .iter()
        .map(|f| {
            let p = f.path.strip_suffix(" (deleted)").unwrap_or(&f.path);
            (f.path.clone(), root.join(p.trim_start_matches('/')))
        })
        .collect())
}

fn search_process(
    roots: &Roots,
    pid: i32,
    files: &[&Prepared],
    align: u64,
) -> anyhow::Result<Vec<FileDupes>> {
    let target = Target::open(&roots.proc, pid)?;
    let maps_path = roots.proc.join(pid.to_string()).join("maps");
    let text = std::fs::read_to_string(&maps_path)
        .with_context(|| format!("failed to read '{}'", maps_path.display()))?;
    let regions: Vec<Region> = Target::regions(&maps_path, &text)?;
    let mut out = Vec::new();
    for f in files {
        let (found, stats) = search::search(&f.index, &f.file, &target, &regions, align)?;
        out.push(file_dupes(
            &f.path,
            &f.container,
            &f.index,
            &regions,
            &found,
            stats,
        ));
    }
    Ok(out)
}

pub fn report(args: &DupesArgs, roots: &Roots) -> anyhow::Result<DupesReport> {
    let procs = ProcReader::new(&roots.proc);
    for pid in &args.pids {
        if !procs.exists(*pid) {
            bail!("no process with pid '{pid}'");
        }
    }
    // Explicit files are validated up front; they apply to every pid.
    let mut prepared: Vec<Prepared> = Vec::new();
    for f in &args.files {
        let shown = std::path::absolute(f).unwrap_or_else(|_| f.clone());
        prepared.push(prepare(&shown.display().to_string(), f, !args.no_widen)?);
    }
    let explicit = prepared.len();
    let mut processes = Vec::new();
    for &pid in &args.pids {
        let comm = procs.status(pid).map(|s| s.comm).unwrap_or_default();
        let mut chosen: Vec<usize> = (0..explicit).collect();
        if explicit == 0 {
            for (shown, open_path) in files_of(roots, pid)? {
                let i = match prepared.iter().position(|p| p.path == shown) {
                    Some(i) => i,
                    None => match prepare(&shown, &open_path, !args.no_widen) {
                        Ok(p) => {
                            prepared.push(p);
                            prepared.len() - 1
                        }
                        Err(e) => {
                            eprintln!("twofold: warning: skipping '{shown}': {e:#}");
                            continue;
                        }
                    },
                };
                chosen.push(i);
            }
        }
        let files: Vec<&Prepared> = chosen.iter().map(|i| &prepared[*i]).collect();
        match search_process(roots, pid, &files, args.align) {
            Ok(files) => processes.push(ProcessDupes {
                pid,
                comm,
                error: None,
                files,
            }),
            Err(e) => processes.push(ProcessDupes {
                pid,
                comm,
                error: Some(format!("{e:#}")),
                files: Vec::new(),
            }),
        }
    }
    let residency: Vec<(String, Option<f64>)> = prepared
        .iter()
        .map(|p| (p.path.clone(), p.page_cache))
        .collect();
    let files = summarize(&processes, &residency);
    Ok(DupesReport {
        schema_version: crate::model::SCHEMA_VERSION,
        processes,
        files,
    })
}

pub fn run(args: &DupesArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let r = report(args, &Roots::live())?;
    for p in &r.processes {
        if let Some(e) = &p.error {
            eprintln!("twofold: warning: pid {} not searched: {e}", p.pid);
        }
    }
    if args.output.json {
        render::json(out, &r)?;
    } else {
        out.write_all(render::dupes::human(&r).as_bytes())?;
    }
    Ok(())
}

//! `twofold residency`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::cli::ResidencyArgs;
use crate::collect::residency::{self, Method};
use crate::collect::system::page_size;
use crate::model::residency::{build, FileResidency};
use crate::render;

#[derive(serde::Serialize)]
struct Doc<'a> {
    schema_version: u32,
    files: &'a [FileResidency],
    total_resident_bytes: u64,
    total_size_bytes: u64,
}

/// Expands the arguments into regular files, validating all of them before any work.
fn expand(args: &ResidencyArgs) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in &args.files {
        let meta = std::fs::symlink_metadata(p)
            .and_then(|m| {
                if m.is_symlink() {
                    std::fs::metadata(p)
                } else {
                    Ok(m)
                }
            })
            .with_context(|| format!("cannot access '{}'", p.display()))?;
        if meta.is_dir() {
            if !args.recursive {
                bail!("'{}' is a directory (use --recursive)", p.display());
            }
            walk(p, &mut out)?;
        } else if meta.is_file() {
            out.push(p.clone());
        } else {
            bail!("'{}' is not a regular file", p.display());
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read directory '{}'", dir.display()))?
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            walk(&e.path(), out)?;
        } else if ft.is_file() {
            out.push(e.path());
        }
    }
    Ok(())
}

/// Residency of one file; a file that cannot be opened is "unknown", not an error.
pub fn one(path: &Path, method: Method, with_map: bool, page: u64) -> FileResidency {
    let shown = path.display().to_string();
    let (file, size) = match residency::open(path) {
        Ok(v) => v,
        Err(e) => {
            return build(
                &shown,
                0,
                page,
                Err(format!("{:#}", anyhow::Error::from(e))),
                None,
            )
        }
    };
    let unknown = |e: residency::ResidencyError| {
        build(
            &shown,
            size,
            page,
            Err(format!("{:#}", anyhow::Error::from(e))),
            None,
        )
    };
    if with_map {
        return match residency::mincore_map(&file, path, size) {
            Ok(m) => {
                let s = crate::sample::ResidencySample {
                    source: crate::sample::ResidencySource::Mincore,
                    cached_bytes: m.resident_pages() * m.page_size,
                    ..Default::default()
                };
                build(&shown, size, page, Ok(&s), Some(&m))
            }
            Err(e) => unknown(e),
        };
    }
    match residency::query(&file, path, size, method) {
        Ok(s) => build(&shown, size, page, Ok(&s), None),
        Err(e) => unknown(e),
    }
}

pub fn run(args: &ResidencyArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let paths = expand(args)?;
    let page = page_size();
    let method: Method = args.method.into();
    let (files, total_resident, total_size, unknown) = if args.summary && !args.map {
        // Totals only: no per-file record (10,000 small files are mostly syscalls).
        let (mut resident, mut size, mut unknown) = (0u64, 0u64, 0usize);
        for p in &paths {
            match residency::open(p)
                .and_then(|(f, len)| residency::query(&f, p, len, method).map(|r| (r, len)))
            {
                Ok((r, len)) => {
                    resident += (r.cached_bytes / page * page).min(len);
                    size += len;
                }
                Err(_) => unknown += 1,
            }
        }
        (Vec::new(), resident, size, unknown)
    } else {
        let files: Vec<FileResidency> = paths
            .iter()
            .map(|p| one(p, method, args.map, page))
            .collect();
        let resident = files.iter().filter_map(|f| f.resident_bytes).sum();
        let size = files.iter().map(|f| f.size_bytes).sum();
        let unknown = files.iter().filter(|f| f.unknown_reason.is_some()).count();
        (files, resident, size, unknown)
    };
    if args.output.json {
        render::json(
            out,
            &Doc {
                schema_version: crate::model::SCHEMA_VERSION,
                files: if args.summary { &[] } else { &files },
                total_resident_bytes: total_resident,
                total_size_bytes: total_size,
            },
        )?;
    } else if args.summary {
        writeln!(
            out,
            "{} files: {} of {} resident{}",
            paths.len(),
            crate::units::iec(total_resident),
            crate::units::iec(total_size),
            if unknown > 0 {
                format!(" ({unknown} unknown)")
            } else {
                String::new()
            }
        )?;
    } else {
        out.write_all(render::residency::human(&files).as_bytes())?;
    }
    Ok(())
}

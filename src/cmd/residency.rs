//! `twofold residency`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::cli::ResidencyArgs;
use crate::collect::answer::{self, Place};
use crate::collect::residency::{self, Method};
use crate::collect::system::page_size;
use crate::model::residency::{build, FileResidency, Totals};
use crate::render;

/// The JSON document. A total is `null` when a part of it is unknown; the known parts
/// and the unknown files are given apart.
#[derive(serde::Serialize)]
struct Doc<'a> {
    schema_version: u32,
    files: &'a [FileResidency],
    total_resident_bytes: Option<u64>,
    total_size_bytes: Option<u64>,
    known_resident_bytes: u64,
    known_size_bytes: u64,
    unknown_files: usize,
    unknown_size_bytes: Option<u64>,
}

/// Expands the arguments into regular files, validating all of them before any work.
fn expand(args: &ResidencyArgs) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in &args.files {
        // Under the deadline: a file whose filesystem does not answer is kept, and its
        // record says so (unknown, never 0 B).
        let q = p.clone();
        let Ok(meta) = answer::within(Place::of(p), p, move || {
            std::fs::symlink_metadata(&q).and_then(|m| {
                if m.is_symlink() {
                    std::fs::metadata(&q)
                } else {
                    Ok(m)
                }
            })
        }) else {
            out.push(p.clone());
            continue;
        };
        let meta = meta.with_context(|| format!("cannot access '{}'", p.display()))?;
        if meta.is_dir() {
            if !args.recursive {
                bail!("'{}' is a directory (use --recursive)", p.display());
            }
            crate::input::refuse_pseudo(p, "directory")?;
            walk(p, &mut out)?;
        } else if meta.is_file() {
            crate::input::refuse_pseudo(p, "file")?;
            out.push(p.clone());
        } else {
            bail!("'{}' is not a regular file", p.display());
        }
    }
    Ok(out)
}

/// The files below `dir`, walked under the deadline ([`answer::within`]).
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let d = dir.to_path_buf();
    let (files, warnings) = answer::within(Place::of(dir), dir, move || {
        let mut warnings = Vec::new();
        crate::collect::walk::files(&d, &mut warnings).map(|f| (f, warnings))
    })
    .map_err(|e| anyhow::anyhow!("{e}"))??;
    out.extend(files.into_iter().map(|(p, _)| p));
    super::warn_all(&warnings);
    Ok(())
}

/// Residency of one file; a file that cannot be opened is "unknown", not an error (its
/// size still comes from `stat`, which needs no permission on the file itself). Read on a
/// helper thread under the deadline ([`answer::within`]): a filesystem that does not
/// answer makes the file's residency unknown, with that reason. A file on FUSE is not
/// opened (opening it there drops its page cache): its residency is not read.
pub fn file_residency(path: &Path, method: Method, with_map: bool, page: u64) -> FileResidency {
    let p = path.to_path_buf();
    // On a local disk filesystem (asked under the deadline) the residency is read here:
    // the map of a huge sparse file can take longer than the deadline on a loaded host,
    // and that is work, not a filesystem that does not answer.
    let q = path.to_path_buf();
    let local = answer::within(Place::of(path), path, move || {
        nix::sys::statfs::statfs(&q).is_ok_and(|s| LOCAL.contains(&s.filesystem_type().0))
    })
    .unwrap_or(false);
    if local {
        let mut r = one_record(&p, method, with_map, page);
        r.path_bytes = crate::collect::interest::raw_if_lossy(path);
        return r;
    }
    let read = answer::within(Place::of(path), path, move || {
        one_record(&p, method, with_map, page)
    });
    let mut r = read.unwrap_or_else(|e| {
        build(
            &path.display().to_string(),
            None,
            page,
            Err(e.unnamed()),
            None,
        )
    });
    r.path_bytes = crate::collect::interest::raw_if_lossy(path);
    r
}

/// `statfs(2)`'s `f_type` of local disk and memory filesystems (ext2/3/4, XFS, Btrfs,
/// F2FS, tmpfs, overlayfs over them): their page-cache queries never wait on a server.
const LOCAL: [i64; 6] = [
    0xEF53,
    0x5846_5342,
    0x9123_683E,
    0xF2F5_2010,
    0x0102_1994,
    0x794C_7630,
];

/// On FUSE: the file's size, and why its residency is not read (`None` elsewhere).
fn on_fuse(path: &Path) -> Option<(Option<u64>, String)> {
    let fuse = nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type().0 == answer::FUSE_SUPER_MAGIC);
    fuse.then(|| {
        let size = std::fs::metadata(path).ok().map(|m| m.len());
        (size, format!("not read: {}", answer::fuse_why(path)))
    })
}

/// The size and cached bytes of one file (`--summary`), or its size and why not.
fn summary_one(path: &Path, method: Method) -> Result<(u64, u64), (Option<u64>, String)> {
    if let Some(not) = on_fuse(path) {
        return Err(not);
    }
    residency::open(path)
        .and_then(|(f, len, _)| {
            residency::query(&f, path, len, method).map(|r| (len, r.cached_bytes))
        })
        .map_err(|e| {
            let size = std::fs::metadata(path).ok().map(|m| m.len());
            (size, format!("{:#}", anyhow::Error::from(e)))
        })
}

fn one_record(path: &Path, method: Method, with_map: bool, page: u64) -> FileResidency {
    let shown = path.display().to_string();
    if let Some((size, why)) = on_fuse(path) {
        return build(&shown, size, page, Err(why), None);
    }
    let (file, size) = match residency::open(path) {
        Ok((f, size, _)) => (f, size),
        Err(e) => {
            let size = std::fs::metadata(path).ok().map(|m| m.len());
            return build(
                &shown,
                size,
                page,
                Err(format!("{:#}", anyhow::Error::from(e))),
                None,
            );
        }
    };
    let unknown = |e: residency::ResidencyError| {
        build(
            &shown,
            Some(size),
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
                build(&shown, Some(size), page, Ok(&s), Some(&m))
            }
            Err(e) => unknown(e),
        };
    }
    match residency::query(&file, path, size, method) {
        Ok(s) => build(&shown, Some(size), page, Ok(&s), None),
        Err(e) => unknown(e),
    }
}

pub fn run(args: &ResidencyArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let paths = expand(args)?;
    let page = page_size();
    let method: Method = args.method.into();
    let mut reasons = Vec::new();
    let (files, totals) = if args.summary && !args.map {
        // Totals only: no per-file record (10,000 small files are mostly syscalls).
        let mut t = Totals::default();
        for p in &paths {
            let q = p.clone();
            let read = answer::within(Place::of(p), p, move || summary_one(&q, method));
            match read {
                Ok(Ok((len, cached))) => t.add(Some(len), Some((cached / page * page).min(len))),
                Ok(Err((size, why))) => {
                    t.add(size, None);
                    reasons.push(why);
                }
                Err(e) => {
                    t.add(None, None);
                    reasons.push(format!("'{}': {}", p.display(), e.unnamed()));
                }
            }
        }
        (Vec::new(), t)
    } else {
        let files: Vec<FileResidency> = paths
            .iter()
            .map(|p| file_residency(p, method, args.map, page))
            .collect();
        reasons.extend(files.iter().filter_map(|f| {
            f.unknown_reason
                .as_ref()
                .map(|r| format!("'{}': {r}", f.path))
        }));
        let t = Totals::of(&files);
        (files, t)
    };
    if !reasons.is_empty() {
        let mut w = vec![format!(
            "residency of {} of {} files is unknown (not counted as 0 B)",
            reasons.len(),
            paths.len()
        )];
        // Reasons one per line, at most a few: 10,000 unreadable files say the same.
        w.extend(reasons.iter().take(5).cloned());
        super::warn_all(&w);
    }
    if args.format.json {
        render::json(
            out,
            &Doc {
                schema_version: crate::model::SCHEMA_VERSION,
                files: if args.summary { &[] } else { &files },
                total_resident_bytes: totals.total_resident_bytes(),
                total_size_bytes: totals.total_size_bytes(),
                known_resident_bytes: totals.resident_bytes,
                known_size_bytes: totals.known_size_bytes,
                unknown_files: totals.unknown_files,
                unknown_size_bytes: totals.unknown_size_bytes,
            },
        )?;
    } else if let Some(columns) = args.fincore_columns() {
        let columns: Vec<render::residency::Column> = columns.iter().map(|&c| c.into()).collect();
        let text = render::residency::fincore(&files, &columns, args.bytes, !args.noheadings);
        out.write_all(text.as_bytes())?;
    } else if args.summary {
        writeln!(out, "{}", render::residency::summary_line(&totals))?; // numbers only
    } else {
        out.write_all(crate::render::safe::terminal(&render::residency::human(&files)).as_bytes())?;
    }
    Ok(())
}

impl From<crate::cli::FincoreColumn> for render::residency::Column {
    fn from(c: crate::cli::FincoreColumn) -> Self {
        use crate::cli::FincoreColumn as F;
        use render::residency::Column;
        match c {
            F::Res => Column::Res,
            F::Pages => Column::Pages,
            F::Size => Column::Size,
            F::File => Column::File,
        }
    }
}

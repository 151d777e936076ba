//! The per-process reads of a gather's phases: `status`, `maps`, `fd` and `cmdline`
//! (phase 1, cached while `statm` and `stat` say nothing changed), `smaps` or `smaps_rollup` (phase 3)
//! and the cgroups of the processes kept.

use crate::sample::{Warning, WarningKind};
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;

use super::cache::{self, BasicParts, Detail, Hit, ProcCache, Read, StatStamp};
use super::cgroup::CgroupReader;
use super::error::Result as CResult;
use super::has_model_extension;
use super::process::{ProcReader, StatusRead};
use crate::sample::{CgroupRef, FileKey, MappingSample, ProcessSample, StatusSample, Unreadable};

/// What phase 1 reads of every process: `status` each time, the rest shared with the
/// cache.
pub(super) struct Basic {
    pub(super) status: StatusRead,
    pub(super) parts: Arc<BasicParts>,
}

/// A process sample completed with a cached phase 3, and whether it is newly refused.
pub(super) fn reuse_detail(p: &ProcessSample, d: &Detail) -> (ProcessSample, bool) {
    let mut p = p.clone();
    let denied_before = p.unreadable == Some(Unreadable::Denied);
    p.mappings = d.mappings.clone();
    p.rollup = d.rollup.clone();
    if p.cmdline.is_empty() {
        p.cmdline = d.cmdline.clone();
    }
    p.cgroup = d.cgroup.clone();
    if d.denied {
        p.unreadable = Some(Unreadable::Denied);
    }
    (p, d.denied && !denied_before)
}

/// The state of the pages of `pid`'s mappings of the `wanted` files now
/// ([`cache::PageState`]), from the `maps` phase 1 kept (each mapping as `smaps` names it:
/// an overlay's file made the real one's); `None` where it maps none of them or
/// `PAGEMAP_SCAN` cannot be read (a kernel before 6.7, a process gone or denied).
pub(super) fn page_state(
    procs: &ProcReader,
    p: &ProcessSample,
    maps: &[MappingSample],
    wanted: &HashSet<FileKey>,
) -> Option<cache::PageState> {
    let ranges: Vec<(u64, u64)> = maps
        .iter()
        .filter_map(|m| {
            let mut m = m.clone();
            procs.real_mapping(p.pid, &mut m);
            wanted.contains(&m.key()).then_some((m.start, m.end))
        })
        .collect();
    if ranges.is_empty() {
        return None;
    }
    let path = procs.root().join(p.pid.to_string()).join("pagemap");
    let pagemap = std::fs::File::open(path).ok()?;
    let mut present = Vec::with_capacity(ranges.len() * 2);
    for &(start, end) in &ranges {
        for anon_only in [false, true] {
            present.push(super::pagescan::present(&pagemap, start, end, anon_only).ok()??);
        }
    }
    Some(cache::PageState {
        mapped: (p.status.rss_file_bytes, p.status.rss_shmem_bytes),
        ranges,
        present,
    })
}

/// Phase 3 of a process that moved, when its mappings of the wanted files did not: the
/// kept detail's mappings, and its `smaps_rollup` (its totals) read again once it is older
/// than [`cache::rollup_every`]. `None` where the page states differ (or were not kept) or
/// the rollup cannot be read: `smaps` then.
pub(super) fn detail_if_pages_stand(
    procs: &ProcReader,
    pid: i32,
    kept: Option<Detail>,
    now: Option<&cache::PageState>,
) -> Option<Detail> {
    let d = kept?;
    let now = now?;
    let same_ranges = d.mappings.len() == now.ranges.len()
        && d.mappings
            .iter()
            .zip(&now.ranges)
            .all(|(m, r)| (m.start, m.end) == *r);
    if !same_ranges || d.pages.as_ref() != Some(now) {
        return None;
    }
    // Its whole-process sums (the process table's PSS and USS, never a count) are kept
    // as long as those of a process that maps none of the files.
    let at = std::time::Instant::now();
    if at.duration_since(d.rollup_at) < cache::rollup_every(d.took) {
        return Some(d);
    }
    let rollup = procs.rollup(pid).ok()?;
    Some(Detail {
        rollup,
        rollup_at: at,
        took: at.elapsed(),
        ..d
    })
}

/// What the cache keeps of a phase 3 read.
pub(super) fn detail_of(p: &ProcessSample, wanted: &HashSet<FileKey>) -> Detail {
    Detail {
        wanted: wanted.clone(),
        pages: None,
        took: std::time::Duration::ZERO,
        rollup_at: std::time::Instant::now(),
        mappings: p.mappings.clone(),
        rollup: p.rollup.clone(),
        cmdline: p.cmdline.clone(),
        cgroup: p.cgroup.clone(),
        denied: p.unreadable == Some(Unreadable::Denied),
        tainted: false,
    }
}

fn in_cgroup(procs: &ProcReader, pid: i32, only: Option<&CgroupRef>) -> CResult<bool> {
    let Some(only) = only else { return Ok(true) };
    let Some(cg) = procs.cgroup(pid)? else {
        return Ok(false);
    };
    let base = only.path.trim_end_matches('/');
    Ok(cg.version == only.version
        && (cg.path == only.path || base.is_empty() || cg.path.starts_with(&format!("{base}/"))))
}

/// Phase 1 of one process, what to tell the cache when there is one, and the `statm`
/// descriptor it opened for the cache to keep.
type BasicRead = (
    CResult<Option<Basic>>,
    Option<(StatStamp, Read)>,
    Option<std::fs::File>,
);

/// Phase 1 of a process that `cache` holds unchanged (its stamp reads as kept), or that
/// is not in the cgroup asked for: `None` for the others, to be read by [`read_basic`]. A
/// live view's steady snapshot finds most processes so, a `statm` read each: done on one
/// thread, as threads cost more than those reads.
pub(super) fn read_basic_quick(
    procs: &ProcReader,
    pid: i32,
    only: Option<&CgroupRef>,
    cache: Option<&ProcCache>,
) -> Option<BasicRead> {
    let c = cache?;
    match in_cgroup(procs, pid, only) {
        Ok(true) => {}
        Ok(false) => return Some((Ok(None), None, None)),
        Err(e) => return Some((Err(e), None, None)),
    }
    let (stat, file) = c.read_stamp(procs.root(), pid)?;
    match c.lookup(pid, &stat) {
        Hit::All(status, parts) => Some((
            Ok(Some(Basic { status, parts })),
            Some((stat, Read::Reused)),
            file,
        )),
        _ => None,
    }
}

/// Phase 1: `status`, `maps` and `fd` (the last two need ptrace read access), or what
/// `cache` holds of them while the stamp (`statm`, then `stat`) says they did not change.
pub(super) fn read_basic(
    procs: &ProcReader,
    pid: i32,
    only: Option<&CgroupRef>,
    cache: Option<&ProcCache>,
) -> BasicRead {
    match in_cgroup(procs, pid, only) {
        Ok(true) => {}
        Ok(false) => return (Ok(None), None, None),
        Err(e) => return (Err(e), None, None),
    }
    // The stamp is read before what it vouches for: a change in between is seen next time.
    let mut opened = None;
    let cached = cache.and_then(|c| {
        let (stat, file) = c.read_stamp(procs.root(), pid)?;
        opened = file;
        let hit = c.lookup(pid, &stat);
        Some((stat, hit))
    });
    let mut before = None;
    let (stat, parts) = match cached {
        Some((stat, Hit::All(status, parts))) => {
            return (
                Ok(Some(Basic { status, parts })),
                Some((stat, Read::Reused)),
                opened,
            )
        }
        Some((stat, Hit::Parts(parts, status))) => {
            before = Some(status);
            (Some(stat), Some(parts))
        }
        // The fds are kept while their number and the command line hold (an `mmap`
        // moves `vsize`, rarely the fd table; an `exec` that keeps the name shows in the
        // command line); the number read where the kernel gives it (one `stat`).
        Some((stat, Hit::PartsIfFds(parts))) => {
            // twofold's own are kept whatever its fds (its kept `/proc` descriptors come
            // and go with the processes it watches; the model files it keeps open, measuring
            // them, make it no holder: an observer is left out).
            let same = pid == procs.own_pid()
                || parts.fd_count.is_some()
                    && procs.fd_count(pid) == parts.fd_count
                    && procs.cmdline(pid).is_ok_and(|c| c[..] == parts.cmdline[..]);
            (Some(stat), same.then_some(parts))
        }
        Some((stat, Hit::Miss)) => (Some(stat), None),
        None => (None, None),
    };
    let status = match procs.status(pid) {
        Ok(s) => s,
        Err(e) => return (Err(e), None, None),
    };
    let parts = match parts {
        // twofold itself is an observer, never a holder ([`super::interest`]): what it
        // maps is of no interest, and its counters move at every snapshot.
        Some(old) if pid == procs.own_pid() => Ok((old, false)),
        // Counters moved, not the size of the address space nor the file and shared
        // memory pages mapped (`RssFile`, `RssShmem`): the mappings are kept too. A
        // process that rewrites its heap or forks moves its counters at every snapshot.
        Some(old) if before.is_some_and(|b| same_mapped(&b.status, &status.status)) => {
            Ok((old, false))
        }
        // Counters moved: `maps` again too (an unmap and a map of the same size leave
        // `vsize` alone, a mapping touched moves `RssFile`), the fds and command line kept.
        Some(old) => read_maps(procs, pid, status.kernel_thread).map(|(maps, denied, mark)| {
            let parts = Arc::new(BasicParts {
                maps,
                observer: mark,
                fds: old.fds.clone(),
                cmdline: old.cmdline.clone(),
                named: old.named.clone(),
                denied: denied || old.denied,
                fd_count: old.fd_count,
                by_file: Default::default(),
            });
            (parts, false)
        }),
        None => read_parts(procs, pid, status.kernel_thread).map(|p| (Arc::new(p), true)),
    };
    match parts {
        Ok((parts, full)) => {
            let read = stat.map(|s| {
                let parts = Arc::clone(&parts);
                let read = if full {
                    Read::Full(status.clone(), parts)
                } else {
                    Read::Status(status.clone(), parts)
                };
                (s, read)
            });
            (Ok(Some(Basic { status, parts })), read, opened)
        }
        Err(e) => (Err(e), None, None),
    }
}

/// Whether two `status` reads of a process map the same file and shared-memory pages
/// (both known and equal): with the same `vsize`, its mappings are taken as unchanged. A
/// file mapped over a reserved range of the same size shows once its pages are touched.
fn same_mapped(a: &StatusSample, b: &StatusSample) -> bool {
    a.rss_file_bytes.is_some()
        && a.rss_shmem_bytes.is_some()
        && a.rss_file_bytes == b.rss_file_bytes
        && a.rss_shmem_bytes == b.rss_shmem_bytes
}

/// `maps` of a process, whether it was refused, and whether it carries the observer mark
/// (nothing for a kernel thread).
fn read_maps(
    procs: &ProcReader,
    pid: i32,
    kernel_thread: bool,
) -> CResult<(Vec<MappingSample>, bool, bool)> {
    if kernel_thread {
        return Ok((Vec::new(), false, false));
    }
    match procs.maps_marked(pid) {
        Ok((m, mark)) => Ok((m, false, mark)),
        Err(e) if e.is_denied() => Ok((Vec::new(), true, false)),
        Err(e) => Err(e),
    }
}

/// `maps`, `fd` and `cmdline` of a process (nothing for a kernel thread).
/// Model files named on a command line (`llama-server -m /models/x.gguf`,
/// `--model=x.onnx`) that exist as regular files, resolved through the process's root (and
/// its working directory, read only for a relative name).
fn named_files(procs: &ProcReader, pid: i32, cmdline: &[String]) -> Vec<cache::NamedFile> {
    let args: Vec<&str> = cmdline
        .iter()
        .skip(1)
        .map(|a| a.rsplit_once('=').map_or(a.as_str(), |(_, v)| v))
        .filter(|a| has_model_extension(a))
        .collect();
    if args.is_empty() {
        return Vec::new();
    }
    let root = procs.root().join(pid.to_string()).join("root");
    let mut cwd: Option<Option<PathBuf>> = None;
    let mut out = Vec::new();
    for a in args {
        let shown = if a.starts_with('/') {
            PathBuf::from(a)
        } else if let Some(cwd) = cwd.get_or_insert_with(|| procs.cwd(pid)) {
            cwd.join(a)
        } else {
            continue;
        };
        let open_path = root.join(shown.to_string_lossy().trim_start_matches('/'));
        // Under the deadline, at the mount that holds the name (from the process's mount
        // table: the same place as its files' devices, so a hung mount costs one deadline
        // a snapshot): a name there is passed over (the files the process maps or holds
        // are still found, by their inode).
        let place = super::answer::Place::of(&open_path);
        let Ok(Ok(meta)) = super::answer::metadata(place, &open_path) else {
            continue;
        };
        if meta.is_file() {
            // An overlay file is the file that holds its bytes ([`super::overlay`]).
            let key = FileKey::from_dev(meta.dev(), meta.ino());
            let (key, open_path) = match procs.overlays().real(pid, key, &shown.to_string_lossy()) {
                Some(r) => (r.key, r.path),
                None => (key, open_path),
            };
            out.push(cache::NamedFile {
                shown,
                key,
                size_bytes: meta.len(),
                open_path,
            });
        }
    }
    out
}

fn read_parts(procs: &ProcReader, pid: i32, kernel_thread: bool) -> CResult<BasicParts> {
    let mut b = BasicParts::default();
    if kernel_thread {
        return Ok(b);
    }
    b.cmdline = procs.cmdline(pid).unwrap_or_default().into();
    b.named = named_files(procs, pid, &b.cmdline);
    match procs.maps_marked(pid) {
        Ok((m, mark)) => {
            b.maps = m;
            b.observer = mark;
        }
        Err(e) if e.is_denied() => b.denied = true,
        Err(e) => return Err(e),
    }
    // twofold's own fds are the thousands of `/proc` files it keeps open: never listed
    // (an observer, never a holder: [`super::interest`]).
    if pid == procs.own_pid() {
        return Ok(b);
    }
    // Counted before they are listed: one opened in between is listed next time.
    b.fd_count = procs.fd_count(pid);
    match procs.open_files(pid) {
        Ok(f) => b.fds = f,
        Err(e) if e.is_denied() => b.denied = true,
        Err(e) => return Err(e),
    }
    Ok(b)
}

/// Phase 3: one page-table walk per process: `smaps` when it maps a file of interest
/// (per-VMA values and the totals), else `smaps_rollup` (none with `defer`). The flag says it was refused
/// here for the first time (phase 1 counted the others).
pub(super) fn read_detail(
    procs: &ProcReader,
    (p, wanted): &(ProcessSample, HashSet<FileKey>),
    defer: bool,
) -> CResult<(ProcessSample, bool)> {
    let mut p = p.clone();
    if p.kernel_thread {
        return Ok((p, false));
    }
    let pid = p.pid;
    let denied_before = p.unreadable == Some(Unreadable::Denied);
    let mut denied = denied_before;
    let rollup = if wanted.is_empty() && defer {
        Ok(None)
    } else if wanted.is_empty() {
        procs.rollup(pid)
    } else {
        procs.smaps(pid, wanted).map(|(m, totals)| {
            p.mappings = m;
            Some(totals)
        })
    };
    match rollup {
        Ok(r) => p.rollup = r,
        Err(e) if e.is_denied() => denied = true,
        Err(e) => return Err(e),
    }
    if p.cmdline.is_empty() {
        p.cmdline = procs.cmdline(pid).unwrap_or_default().into();
    }
    p.cgroup = procs.cgroup(pid).ok().flatten();
    if denied {
        p.unreadable = Some(Unreadable::Denied);
    }
    Ok((p, denied && !denied_before))
}

pub(super) fn read_cgroups(
    reader: &CgroupReader,
    procs: &[ProcessSample],
    only: Option<CgroupRef>,
    warnings: &mut Vec<Warning>,
) -> Vec<crate::sample::CgroupSample> {
    let mut refs: Vec<CgroupRef> = procs
        .iter()
        .filter(|p| !p.mappings.is_empty() || !p.open_files.is_empty())
        .filter_map(|p| p.cgroup.clone())
        .chain(only)
        .collect();
    refs.sort();
    refs.dedup();
    let mut out = Vec::new();
    for cg in refs {
        match reader.read(&cg) {
            Ok(s) => out.push(s),
            Err(e) => warnings.push(Warning::new(
                WarningKind::CgroupUnreadable,
                cg.path.clone(),
                format!(
                    "cgroup '{}' unreadable: {:#}",
                    cg.path,
                    anyhow::Error::from(e)
                ),
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// twofold's own fds are never listed (an observer; its kept `/proc` descriptors
    /// would cost an `fstatat` and a `readlink` each), another process's are.
    #[test]
    fn own_fds_are_not_listed_another_process_s_are() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let held = std::fs::File::open(&path).unwrap();
        let procs = ProcReader::new("/proc");
        let own = read_parts(&procs, std::process::id() as i32, false).unwrap();
        assert!(own.fds.is_empty(), "{:?}", own.fds);
        assert_eq!(own.fd_count, None);
        // A child holding the same file open (its stdin) is listed with it.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(held)
            .spawn()
            .unwrap();
        let theirs = read_parts(&procs, child.id() as i32, false).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            theirs.fds.iter().any(|f| f.fd == 0 && f.size_bytes == 8192),
            "{:?}",
            theirs.fds
        );
    }
}

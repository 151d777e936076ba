//! One scan's worth of reading: which processes, which files of interest, which cgroups.
//!
//! Order of work keeps the cost proportional to what matters: `status`, `maps` and `fd` for
//! every process (cheap), then `smaps_rollup`, `smaps` (only the VMAs of files of interest),
//! `cmdline` and `cgroup` only for processes that hold a file of interest or were asked for.
//! A process that exits mid-scan is counted in `skipped.gone`; one whose private files are
//! refused (another user's, without root or `CAP_SYS_PTRACE`) in `skipped.denied`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;

use super::cache::{self, BasicParts, Detail, Hit, ProcCache, Read, StatStamp};
use super::cgroup::CgroupReader;
use super::error::Result as CResult;
use super::process::{ProcReader, StatusRead};
use super::reopen;
use super::residency::{self, Method};
use super::{has_model_extension, system, Roots};
use crate::sample::{
    CandidateSample, CandidateWhy, CgroupRef, FileKey, FileSample, MappingSample, OpenFileSample,
    ProcessSample, Sample, Unreadable,
};

/// What to scan.
#[derive(Debug, Clone)]
pub struct Request {
    /// Files or directories named by the user (always of interest).
    pub paths: Vec<PathBuf>,
    /// Only these processes (all when empty).
    pub pids: Vec<i32>,
    /// Only processes in this cgroup (or below it); its counters are reported.
    pub cgroup: Option<PathBuf>,
    /// Files at least this large are of interest whatever their extension.
    pub min_size: u64,
    /// Report every process, not only the holders of files of interest.
    pub all_processes: bool,
    pub residency: Method,
    /// Also look for copies of the model files in the well-known stores
    /// ([`super::stores`]); `scan` without paths does.
    pub stores: bool,
    /// Find the processes whose private memory could hold a copy of a file of interest
    /// (copy holders that closed the file), for the proof.
    pub candidates: bool,
    /// Only the files in `paths` (and an older inode still held at one of their paths),
    /// with their holders and candidates: `scan FILE...` without `--all`.
    pub only_paths: bool,
    /// Processes holding device memory (NVML): kept in the sample even when they hold no
    /// file, so that a device copy made by one that read or named the file and closed it
    /// can be suspected (filled in by the engine each snapshot).
    pub gpu_pids: Vec<i32>,
}

impl Default for Request {
    fn default() -> Self {
        Request {
            paths: Vec::new(),
            pids: Vec::new(),
            cgroup: None,
            min_size: 64 << 20,
            all_processes: false,
            residency: Method::Auto,
            stores: false,
            candidates: true,
            only_paths: false,
            gpu_pids: Vec::new(),
        }
    }
}

/// A file of interest while gathering: how to open it and how to show it.
#[derive(Debug, Clone)]
struct Interest {
    shown: String,
    /// `shown`'s bytes when they are not UTF-8.
    raw: Option<Vec<u8>>,
    open_path: PathBuf,
    size_bytes: Option<u64>,
    explicit: bool,
    store: bool,
}

struct Gatherer<'a> {
    procs: ProcReader,
    req: &'a Request,
    /// Decided files: `Some` = of interest, `None` = looked at and not of interest.
    decided: HashMap<FileKey, Option<Interest>>,
    /// (pid, file) pairs where the file is named on the process's command line.
    named: HashSet<(i32, FileKey)>,
    /// The executable this process runs, to know twofold's own processes by.
    own_exe: Option<FileKey>,
    /// twofold's own processes: left out (see [`Gatherer::is_observer`]).
    observers: Vec<i32>,
    /// The absolute paths of the files named by the user.
    explicit: HashSet<PathBuf>,
    /// `PROC/self/mountinfo`, read when a path must be resolved to the host's.
    own_mounts: Option<Option<String>>,
    warnings: &'a mut Vec<String>,
}

/// Reads everything a scan needs. Errors are for bad input (a missing path, an unknown
/// pid, an unreadable procfs root); a process's trouble is counted, never fatal.
pub fn gather(roots: &Roots, req: &Request, warnings: &mut Vec<String>) -> anyhow::Result<Sample> {
    gather_cached(roots, req, warnings, None)
}

/// [`gather`], reusing what `cache` kept of processes that did not change since the last
/// call (see [`super::cache`]); a long-lived engine passes the same cache every time.
pub fn gather_cached(
    roots: &Roots,
    req: &Request,
    warnings: &mut Vec<String>,
    mut cache: Option<&mut ProcCache>,
) -> anyhow::Result<Sample> {
    let profile = std::env::var_os("TWOFOLD_PROFILE").is_some();
    let mut clock = Instant::now();
    let mut lap = |what: &str| {
        if profile {
            eprintln!(
                "gather: {what}: {:.1} ms",
                clock.elapsed().as_secs_f64() * 1e3
            );
        }
        clock = Instant::now();
    };
    let mut sample = Sample {
        system: system::read(&roots.proc)?,
        privilege: super::access::privilege(&roots.proc),
        ..Sample::default()
    };
    let policy = sample.privilege.is_some_and(|p| p.reads_any());
    let mut g = Gatherer {
        procs: ProcReader::new(&roots.proc),
        req,
        decided: HashMap::new(),
        named: HashSet::new(),
        own_exe: own_exe(&roots.proc),
        observers: Vec::new(),
        explicit: HashSet::new(),
        own_mounts: None,
        warnings,
    };
    g.add_explicit_paths()?;
    if req.stores {
        g.add_store_files();
    }

    let cgroups = CgroupReader::new(&roots.cgroup);
    let only_cgroup = match &req.cgroup {
        Some(p) => Some(
            cgroups
                .resolve(p)
                .with_context(|| format!("no memory cgroup at '{}'", p.display()))?
                .1,
        ),
        None => None,
    };

    let pids = if req.pids.is_empty() {
        g.procs.pids()?
    } else {
        for pid in &req.pids {
            crate::input::check_pid(&roots.proc, *pid)?;
        }
        req.pids.clone()
    };

    lap("setup");
    // Phase 1, in parallel: status, maps and fds of every process (cheap).
    let procs = g.procs.clone();
    if let Some(c) = cache.as_deref_mut() {
        c.begin();
    }
    let view = cache.as_deref();
    let basics = super::par_map(&pids, |pid| {
        read_basic(&procs, *pid, only_cgroup.as_ref(), view)
    });
    let basics: Vec<_> = pids
        .iter()
        .zip(basics)
        .map(|(pid, (basic, stamp))| {
            if let (Some(c), Some((stat, read))) = (cache.as_deref_mut(), stamp) {
                c.put_basic(*pid, stat, read);
            }
            basic
        })
        .collect();
    lap("phase 1 (status, maps, fds)");
    // Phase 2: which files are of interest (a stat per new file, cached), which
    // processes to keep.
    let mut kept = Vec::new();
    let mut others = Vec::new();
    for (pid, basic) in pids.iter().zip(basics) {
        match basic {
            Ok(Some(b)) => {
                // Counted whether it is kept or not: whether another user's process
                // maps or holds a file of interest is unknown, never "no".
                if b.parts.denied {
                    sample.skipped.denied += 1;
                }
                match g.keep(*pid, b) {
                    Ok(k) => kept.push(k),
                    Err(Some(other)) => others.push(other),
                    Err(None) => {}
                }
            }
            Ok(None) => {}
            Err(e) if e.is_gone() => sample.skipped.gone += 1,
            Err(e) if e.is_denied() => sample.skipped.denied += 1,
            Err(e) => g.warnings.push(format!("{:#}", anyhow::Error::from(e))),
        }
    }
    // Processes holding nothing that could still hold a copy (read, then closed).
    if req.candidates {
        let sizes = g.interest_sizes();
        for p in others {
            if req.gpu_pids.contains(&p.pid) || could_hold_any(&procs, &p, &sizes, &g.named) {
                kept.push((p, HashSet::new()));
            }
        }
    }
    lap("phase 2 (files of interest)");
    // Phase 3, in parallel: smaps (or smaps_rollup), cmdline and cgroup of the kept ones.
    if let Some(c) = cache.as_deref_mut() {
        c.end_basic(kept.iter().map(|(p, w)| (p.pid, w)));
    }
    let view = cache.as_deref();
    let details = super::par_map(&kept, |k| {
        match view.and_then(|c| c.detail(k.0.pid, &k.1)) {
            Some(d) => (Ok(reuse_detail(&k.0, &d)), None),
            None => {
                let r = read_detail(&procs, k);
                let d = r.as_ref().ok().map(|(p, _)| detail_of(p, &k.1));
                (r, d)
            }
        }
    });
    let details: Vec<_> = kept
        .iter()
        .zip(details)
        .map(|(k, (r, d))| {
            if let (Some(c), true) = (cache.as_deref_mut(), r.is_ok()) {
                c.put_detail(k.0.pid, d);
            }
            r
        })
        .collect();
    lap("phase 3 (smaps, cgroup)");
    if profile {
        if let Some(c) = cache.as_deref() {
            eprintln!("gather: cache: {:?}", c.stats);
        }
    }
    for detail in details {
        match detail {
            Ok((p, newly_denied)) => {
                if newly_denied {
                    sample.skipped.denied += 1;
                }
                sample.processes.push(p)
            }
            Err(e) if e.is_gone() => sample.skipped.gone += 1,
            Err(e) if e.is_denied() => sample.skipped.denied += 1,
            Err(e) => g.warnings.push(format!("{:#}", anyhow::Error::from(e))),
        }
    }
    if sample.skipped.denied > 0 && policy {
        g.warnings.push(format!(
            "{} could not be read fully: their smaps, maps or fds were {}; whether they map or hold the files is unknown",
            crate::units::count(sample.skipped.denied as u64, "process", "processes"),
            super::access::POLICY
        ));
    } else if sample.skipped.denied > 0 {
        g.warnings.push(format!(
            "{} could not be read fully (their smaps, maps or fds need root or CAP_SYS_PTRACE): whether they map or hold the files, and their PSS, are unknown",
            crate::units::count(sample.skipped.denied as u64, "process", "processes")
        ));
    }

    let sizes = g.interest_sizes();
    if req.candidates {
        for p in &mut sample.processes {
            if p.rchar_bytes.is_none() && !p.kernel_thread {
                p.rchar_bytes = procs.rchar(p.pid).ok().flatten();
            }
        }
        sample.candidates = candidates(&sample.processes, &sizes, &g.named);
        if policy {
            // Refused even to root: what it maps, holds and read() is unknown, and its
            // memory cannot be searched. Without evidence (it does not name the file)
            // it is no candidate: it would make every small file's count a lower bound.
            let refused: HashSet<i32> = sample
                .processes
                .iter()
                .filter(|p| p.unreadable == Some(Unreadable::Denied))
                .map(|p| p.pid)
                .collect();
            sample
                .candidates
                .retain(|c| !(refused.contains(&c.pid) && c.why == CandidateWhy::Unknown));
        }
        sample.named = g.named.iter().copied().collect();
        sample.named.sort_unstable();
    }
    lap("candidates (rchar)");
    g.observers.sort_unstable();
    sample.observers = std::mem::take(&mut g.observers);
    sample.files = g.files(&sample);
    lap("files (residency)");
    sample.cgroups = read_cgroups(&cgroups, &sample.processes, only_cgroup, g.warnings);
    lap("cgroups");
    Ok(sample)
}

/// What phase 1 reads of every process: `status` each time, the rest shared with the
/// cache.
struct Basic {
    status: StatusRead,
    parts: Arc<BasicParts>,
}

/// A process sample completed with a cached phase 3, and whether it is newly refused.
fn reuse_detail(p: &ProcessSample, d: &Detail) -> (ProcessSample, bool) {
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

/// What the cache keeps of a phase 3 read.
fn detail_of(p: &ProcessSample, wanted: &HashSet<FileKey>) -> Detail {
    Detail {
        wanted: wanted.clone(),
        mappings: p.mappings.clone(),
        rollup: p.rollup.clone(),
        cmdline: p.cmdline.clone(),
        cgroup: p.cgroup.clone(),
        denied: p.unreadable == Some(Unreadable::Denied),
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

/// Phase 1 of one process, and what to tell the cache when there is one.
type BasicRead = (CResult<Option<Basic>>, Option<(StatStamp, Read)>);

/// Phase 1: `status`, `maps` and `fd` (the last two need ptrace read access), or what
/// `cache` holds of them while `stat` says they did not change.
fn read_basic(
    procs: &ProcReader,
    pid: i32,
    only: Option<&CgroupRef>,
    cache: Option<&ProcCache>,
) -> BasicRead {
    match in_cgroup(procs, pid, only) {
        Ok(true) => {}
        Ok(false) => return (Ok(None), None),
        Err(e) => return (Err(e), None),
    }
    // The stamp is read before what it vouches for: a change in between is seen next time.
    let cached = cache.and_then(|c| {
        let stat = cache::read_stat(procs.root(), pid)?;
        let hit = c.lookup(pid, &stat);
        Some((stat, hit))
    });
    let (stat, parts) = match cached {
        Some((stat, Hit::All(status, parts))) => {
            return (
                Ok(Some(Basic { status, parts })),
                Some((stat, Read::Reused)),
            )
        }
        Some((stat, Hit::Parts(parts))) => (Some(stat), Some(parts)),
        Some((stat, Hit::Miss)) => (Some(stat), None),
        None => (None, None),
    };
    let status = match procs.status(pid) {
        Ok(s) => s,
        Err(e) => return (Err(e), None),
    };
    let parts = match parts {
        // Counters moved: `maps` again too (an unmap and a map of the same size leave
        // `vsize` alone), the fds and command line kept.
        Some(old) => read_maps(procs, pid, status.kernel_thread).map(|(maps, denied)| {
            let parts = Arc::new(BasicParts {
                maps,
                fds: old.fds.clone(),
                cmdline: old.cmdline.clone(),
                named: old.named.clone(),
                denied: denied || old.denied,
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
            (Ok(Some(Basic { status, parts })), read)
        }
        Err(e) => (Err(e), None),
    }
}

/// `maps` of a process, and whether it was refused (nothing for a kernel thread).
fn read_maps(
    procs: &ProcReader,
    pid: i32,
    kernel_thread: bool,
) -> CResult<(Vec<MappingSample>, bool)> {
    if kernel_thread {
        return Ok((Vec::new(), false));
    }
    match procs.maps(pid) {
        Ok(m) => Ok((m, false)),
        Err(e) if e.is_denied() => Ok((Vec::new(), true)),
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
        let Ok(meta) = std::fs::metadata(&open_path) else {
            continue;
        };
        if meta.is_file() {
            out.push(cache::NamedFile {
                shown,
                key: FileKey::from_dev(meta.dev(), meta.ino()),
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
    b.cmdline = procs.cmdline(pid).unwrap_or_default();
    b.named = named_files(procs, pid, &b.cmdline);
    match procs.maps(pid) {
        Ok(m) => b.maps = m,
        Err(e) if e.is_denied() => b.denied = true,
        Err(e) => return Err(e),
    }
    match procs.open_files(pid) {
        Ok(f) => b.fds = f,
        Err(e) if e.is_denied() => b.denied = true,
        Err(e) => return Err(e),
    }
    Ok(b)
}

/// Phase 3: one page-table walk per process: `smaps` when it maps a file of interest
/// (per-VMA values and the totals), else `smaps_rollup`. The flag says it was refused
/// here for the first time (phase 1 counted the others).
fn read_detail(
    procs: &ProcReader,
    (p, wanted): &(ProcessSample, HashSet<FileKey>),
) -> CResult<(ProcessSample, bool)> {
    let mut p = p.clone();
    if p.kernel_thread {
        return Ok((p, false));
    }
    let pid = p.pid;
    let denied_before = p.unreadable == Some(Unreadable::Denied);
    let mut denied = denied_before;
    let rollup = if wanted.is_empty() {
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
        p.cmdline = procs.cmdline(pid).unwrap_or_default();
    }
    p.cgroup = procs.cgroup(pid).ok().flatten();
    if denied {
        p.unreadable = Some(Unreadable::Denied);
    }
    Ok((p, denied && !denied_before))
}

fn read_cgroups(
    reader: &CgroupReader,
    procs: &[ProcessSample],
    only: Option<CgroupRef>,
    warnings: &mut Vec<String>,
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
            Err(e) => warnings.push(format!(
                "cgroup '{}' unreadable: {:#}",
                cg.path,
                anyhow::Error::from(e)
            )),
        }
    }
    out
}

impl Gatherer<'_> {
    fn add_explicit_paths(&mut self) -> anyhow::Result<()> {
        for path in &self.req.paths {
            let meta = std::fs::metadata(path)
                .with_context(|| format!("cannot access '{}'", path.display()))?;
            if meta.is_dir() {
                crate::input::refuse_pseudo(path, "directory")?;
                self.walk(path)?;
            } else if meta.is_file() {
                crate::input::refuse_pseudo(path, "file")?;
                self.insert_explicit(path, &meta);
            } else {
                return Err(crate::input::not_file_or_dir(path, &meta));
            }
        }
        Ok(())
    }

    fn walk(&mut self, dir: &Path) -> anyhow::Result<()> {
        for (p, meta) in super::walk::files(dir, self.warnings)? {
            if has_model_extension(&p.to_string_lossy()) || meta.len() >= self.req.min_size {
                self.insert_explicit(&p, &meta);
            }
        }
        Ok(())
    }

    fn insert_explicit(&mut self, path: &Path, meta: &std::fs::Metadata) {
        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        self.explicit.insert(abs.clone());
        self.decided.insert(
            FileKey::from_dev(meta.dev(), meta.ino()),
            Some(Interest {
                shown: abs.display().to_string(),
                raw: raw_if_lossy(&abs),
                open_path: abs,
                size_bytes: Some(meta.len()),
                explicit: true,
                store: false,
            }),
        );
    }

    /// Decides whether a file a process maps or holds is of interest.
    /// Code (a file some process maps executable: programs, shared libraries such as a
    /// 1 GiB `libtorch_cuda.so`) is never a model by size alone.
    fn decide(
        &mut self,
        pid: i32,
        key: FileKey,
        path: &str,
        size: Option<u64>,
        alt: Option<PathBuf>,
        code: bool,
    ) -> bool {
        if let Some(d) = self.decided.get(&key) {
            return d.is_some();
        }
        // Never through a path with " (deleted)" appended; the inode itself through `alt`
        // (its map_files or fd) when the path is gone or names another one.
        let open_path = reopen::in_root(self.procs.root(), pid, path);
        let size = size.or_else(|| {
            [Some(&open_path), alt.as_ref()]
                .into_iter()
                .flatten()
                .filter_map(|p| std::fs::metadata(p).ok())
                .find(|m| reopen::identity(m) == key)
                .map(|m| m.len())
        });
        let mut interesting =
            has_model_extension(path) || (!code && size.is_some_and(|s| s >= self.req.min_size));
        // The host's name for it, when the process names it from another mount
        // namespace (never for an unlinked one: it has no name left).
        let host = (interesting && !path.ends_with(reopen::DELETED))
            .then(|| self.host_path(pid, key, path))
            .flatten();
        let (shown, raw, open_path) = match host {
            Some(h) => (h.display().to_string(), raw_if_lossy(&h), h),
            None => (path.to_string(), None, open_path),
        };
        if self.req.only_paths {
            // `scan FILE`: another inode is of interest only at one of the paths named.
            interesting &= self
                .explicit
                .contains(Path::new(reopen::strip_deleted(&shown)));
        }
        let value = interesting.then_some(Interest {
            shown,
            raw,
            open_path,
            size_bytes: size,
            explicit: false,
            store: false,
        });
        self.decided.insert(key, value);
        interesting
    }

    /// The host path of the file `key` that process `pid` names `path`: `path` itself
    /// when it is that file here, else through the process's mounts
    /// ([`super::mounts::host_candidates`]); `None` when the host has no name for it.
    fn host_path(&mut self, pid: i32, key: FileKey, path: &str) -> Option<PathBuf> {
        let p = Path::new(path);
        let is_it = |p: &Path| std::fs::metadata(p).is_ok_and(|m| reopen::identity(&m) == key);
        if !p.is_absolute() {
            return None;
        }
        if is_it(p) {
            return Some(p.to_path_buf());
        }
        let proc = self.procs.root().to_path_buf();
        let ours = self
            .own_mounts
            .get_or_insert_with(|| std::fs::read_to_string(proc.join("self/mountinfo")).ok())
            .as_deref()?;
        let theirs = std::fs::read_to_string(proc.join(pid.to_string()).join("mountinfo")).ok()?;
        super::mounts::host_candidates(&theirs, ours, p)
            .into_iter()
            .find(|c| is_it(c))
    }

    /// Decides the files of interest of one process: `Ok` to report it, `Err(Some)` for a
    /// process that holds nothing (it may still hold a copy), `Err(None)` to drop it.
    #[allow(clippy::result_large_err)]
    fn keep(
        &mut self,
        pid: i32,
        b: Basic,
    ) -> std::result::Result<(ProcessSample, HashSet<FileKey>), Option<ProcessSample>> {
        let asked = self.req.pids.contains(&pid);
        let named = Arc::clone(&b.parts);
        let named = &named.named;
        let mut p = ProcessSample {
            pid,
            comm: b.status.comm,
            kernel_thread: b.status.kernel_thread,
            status: b.status.status,
            unreadable: b.parts.denied.then_some(Unreadable::Denied),
            cmdline: b.parts.cmdline.clone(),
            ..ProcessSample::default()
        };
        if p.kernel_thread {
            return if asked || self.req.all_processes {
                Ok((p, HashSet::new()))
            } else {
                Err(None)
            };
        }
        if self.is_observer(pid, &b.parts) {
            self.observers.push(pid);
            return Err(None);
        }
        let mut wanted = HashSet::new();
        let code: HashSet<FileKey> = b
            .parts
            .maps
            .iter()
            .filter(|m| m.perms.exec)
            .map(|m| m.key())
            .collect();
        for m in &b.parts.maps {
            let alt = (!self.decided.contains_key(&m.key()))
                .then(|| reopen::map_file(self.procs.root(), pid, m.start, m.end));
            if self.decide(pid, m.key(), &m.path, None, alt, code.contains(&m.key())) {
                wanted.insert(m.key());
            }
        }
        for fd in &b.parts.fds {
            if self.decide(
                pid,
                fd.key,
                &fd.path,
                Some(fd.size_bytes),
                None,
                code.contains(&fd.key),
            ) {
                p.open_files.push(OpenFileSample {
                    fd: fd.fd,
                    key: fd.key,
                    path: fd.path.clone(),
                });
            }
        }
        if self.req.candidates {
            self.add_named(pid, named);
        }
        let holds = !wanted.is_empty() || !p.open_files.is_empty();
        if holds || asked || self.req.all_processes {
            Ok((p, wanted))
        } else {
            Err(Some(p))
        }
    }

    /// twofold's own processes: this one, and any other running the same executable (a
    /// recorder, an exporter, another scan), except the reader children of `twofold
    /// __child`, which are workloads. What they map or hold is there because they
    /// observe it: they are never holders, mappers or candidates.
    fn is_observer(&self, pid: i32, parts: &BasicParts) -> bool {
        if pid == std::process::id() as i32 {
            return true;
        }
        let Some(exe) = self.own_exe else {
            return false;
        };
        parts.maps.iter().any(|m| m.perms.exec && m.key() == exe)
            && parts.cmdline.get(1).map(String::as_str) != Some("__child")
    }

    /// Model files named on the command line ([`named_files`]) become files of interest,
    /// and the process a candidate copy holder of them.
    fn add_named(&mut self, pid: i32, named: &[cache::NamedFile]) {
        for n in named {
            if self.req.only_paths && !self.decided.contains_key(&n.key) {
                // `scan FILE`: a file the user did not name is not of interest.
                continue;
            }
            self.decided.entry(n.key).or_insert_with(|| {
                Some(Interest {
                    shown: n.shown.display().to_string(),
                    raw: raw_if_lossy(&n.shown),
                    open_path: n.open_path.clone(),
                    size_bytes: Some(n.size_bytes),
                    explicit: false,
                    store: false,
                })
            });
            if self.decided.get(&n.key).is_some_and(|d| d.is_some()) {
                self.named.insert((pid, n.key));
            }
        }
    }

    /// Model files of the well-known stores (see [`super::stores`]).
    fn add_store_files(&mut self) {
        let dirs = super::stores::dirs(|k| std::env::var_os(k));
        for (path, key, size) in super::stores::model_files(&dirs) {
            self.decided.entry(key).or_insert_with(|| {
                Some(Interest {
                    shown: path.display().to_string(),
                    raw: raw_if_lossy(&path),
                    open_path: path,
                    size_bytes: Some(size),
                    explicit: false,
                    store: true,
                })
            });
        }
    }

    /// Sizes of the files of interest known so far.
    fn interest_sizes(&self) -> Vec<(FileKey, u64)> {
        let mut v: Vec<(FileKey, u64)> = self
            .decided
            .iter()
            .filter_map(|(k, i)| Some((*k, i.as_ref()?.size_bytes?)))
            .filter(|(_, s)| *s > 0)
            .collect();
        v.sort();
        v
    }

    /// Files of interest with their residency, largest first. Store files are kept only
    /// when a process holds them or could hold a copy of them.
    fn files(&mut self, sample: &Sample) -> Vec<FileSample> {
        let mut by_key: BTreeMap<FileKey, Interest> = BTreeMap::new();
        for (k, v) in self.decided.drain() {
            if let Some(i) = v {
                by_key.insert(k, i);
            }
        }
        let referenced = |k: &FileKey| {
            sample.candidates.iter().any(|c| c.file == *k)
                || sample.processes.iter().any(|p| {
                    p.mappings.iter().any(|m| m.key() == *k)
                        || p.open_files.iter().any(|o| o.key == *k)
                })
        };
        let mut out: Vec<FileSample> = by_key
            .into_iter()
            .filter(|(k, i)| !i.store || referenced(k))
            .map(|(key, i)| {
                let ways = reopen::ways(
                    self.procs.root(),
                    &sample.processes,
                    key,
                    Some(&i.open_path),
                );
                let mut f = file_sample(key, i, &ways, self.req.residency);
                f.seen_as = seen_as(&sample.processes, key, &f.path);
                f
            })
            .collect();
        out.sort_by(|a, b| b.size_bytes.cmp(&a.size_bytes).then(a.path.cmp(&b.path)));
        out
    }
}

/// The (dev, inode) of the executable this process runs, through `PROC/self/exe` (the
/// inode it runs, even when the path was replaced since); `None` under a procfs root that
/// has no `self` (a fixture tree).
fn own_exe(proc_root: &Path) -> Option<FileKey> {
    let m = std::fs::metadata(proc_root.join("self").join("exe")).ok()?;
    Some(FileKey::from_dev(m.dev(), m.ino()))
}

/// The names processes give the file `key` other than `shown` (sorted, once each).
fn seen_as(processes: &[ProcessSample], key: FileKey, shown: &str) -> Vec<String> {
    let shown = reopen::strip_deleted(shown);
    let mut out: Vec<String> = processes
        .iter()
        .flat_map(|p| {
            let maps = p
                .mappings
                .iter()
                .filter(|m| m.key() == key)
                .map(|m| &m.path);
            let fds = p
                .open_files
                .iter()
                .filter(|o| o.key == key)
                .map(|o| &o.path);
            maps.chain(fds)
        })
        .map(|p| reopen::strip_deleted(p).to_string())
        .filter(|p| p != shown)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A private copy is looked for only where it could be most of the file: private
/// anonymous memory at least this fraction of the file's size (the model's policy).
pub use crate::model::SUSPECT_FRACTION as COPY_FRACTION;

fn big_enough(anon: u64, size: u64) -> bool {
    anon as f64 >= COPY_FRACTION * size as f64
}

/// Before the detail phase: could a process that holds nothing hold a copy of one of the
/// files (by its `RssAnon` and `RssShmem`, its command line, and `rchar`)? Reads `rchar`
/// when needed. Shared memory large enough holds a copy whoever filled it.
fn could_hold_any(
    procs: &ProcReader,
    p: &ProcessSample,
    sizes: &[(FileKey, u64)],
    named: &HashSet<(i32, FileKey)>,
) -> bool {
    let Some(anon) = p.status.rss_anon_bytes else {
        return false;
    };
    let shmem = p.status.rss_shmem_bytes.unwrap_or(0);
    let anon = anon + shmem;
    if p.pid == std::process::id() as i32 || !sizes.iter().any(|(_, s)| big_enough(anon, *s)) {
        return false;
    }
    if sizes.iter().any(|(_, s)| big_enough(shmem, *s)) {
        return true;
    }
    if sizes
        .iter()
        .any(|(k, s)| named.contains(&(p.pid, *k)) && big_enough(anon, *s))
    {
        return true;
    }
    match procs.rchar(p.pid) {
        Ok(Some(r)) => sizes
            .iter()
            .any(|(_, s)| big_enough(anon, *s) && big_enough(r, *s)),
        _ => true,
    }
}

/// The candidate copy holders of each file: private anonymous memory (`RssAnon` less the
/// CoW pages of mapped files of interest) of at least [`COPY_FRACTION`] of the file, and a
/// way to have made the copy: it maps or holds the file, names it on its command line,
/// read() enough bytes (`rchar`), or its `rchar` is unknown.
pub fn candidates(
    processes: &[ProcessSample],
    sizes: &[(FileKey, u64)],
    named: &HashSet<(i32, FileKey)>,
) -> Vec<CandidateSample> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    for p in processes.iter().filter(|p| !p.kernel_thread && p.pid != me) {
        let Some(anon) = p.status.rss_anon_bytes else {
            continue;
        };
        let cow: u64 = p.mappings.iter().filter_map(|m| m.anonymous_bytes).sum();
        let private = anon.saturating_sub(cow);
        // Shared memory (shmem, memfd, /dev/shm files) can hold a copy too.
        let shmem = p.status.rss_shmem_bytes.unwrap_or(0);
        for &(key, size) in sizes {
            // A model file in shared memory that it maps is its own page cache there.
            let own: u64 = p
                .mappings
                .iter()
                .filter(|m| m.key() == key && m.major == 0)
                .filter_map(|m| m.rss_bytes)
                .sum();
            let room = private + shmem.saturating_sub(own);
            if !big_enough(room, size) {
                continue;
            }
            let holder = p.mappings.iter().any(|m| m.key() == key)
                || p.open_files.iter().any(|o| o.key == key);
            let why = if holder {
                CandidateWhy::Holder
            } else if named.contains(&(p.pid, key)) {
                CandidateWhy::Named
            } else {
                match p.rchar_bytes {
                    Some(r) if big_enough(r, size) => CandidateWhy::Read,
                    // Another process may have filled the shared memory it maps (`cp` to
                    // /dev/shm, a loader's memfd).
                    Some(_) if big_enough(shmem.saturating_sub(own), size) => {
                        CandidateWhy::SharedMemory
                    }
                    Some(_) => continue,
                    None => CandidateWhy::Unknown,
                }
            };
            out.push(CandidateSample {
                pid: p.pid,
                file: key,
                why,
                private_anon_bytes: room,
            });
        }
    }
    out
}

/// A path's bytes when they are not UTF-8 (its `display()` is lossy).
pub fn raw_if_lossy(p: &Path) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    p.to_str()
        .is_none()
        .then(|| p.as_os_str().as_bytes().to_vec())
}

fn file_sample(key: FileKey, i: Interest, ways: &[PathBuf], method: Method) -> FileSample {
    // What the name it is shown by names now: this inode, another one, or nothing.
    let now_at_path = std::fs::metadata(&i.open_path)
        .ok()
        .map(|m| reopen::identity(&m))
        .filter(|k| *k != key);
    let mut f = FileSample {
        key,
        deleted: i.shown.ends_with(reopen::DELETED) || now_at_path.is_some(),
        now_at_path,
        seen_as: Vec::new(),
        path: i.shown,
        path_bytes: i.raw,
        size_bytes: i.size_bytes,
        residency: None,
        residency_error: None,
        explicit: i.explicit,
        store: i.store,
    };
    let opened = reopen::open_inode(ways, key, |p| {
        let (file, size) = residency::open(p).map_err(|e| match e {
            residency::ResidencyError::Open { source, .. } => source,
            other => std::io::Error::other(other.to_string()),
        })?;
        let k = reopen::identity(&file.metadata()?);
        Ok(((file, size), k))
    });
    match opened {
        Ok(((file, size), path)) => {
            f.size_bytes = Some(size);
            match residency::query(&file, &path, size, method) {
                Ok(r) => f.residency = Some(r),
                Err(e) => f.residency_error = Some(format!("{:#}", anyhow::Error::from(e))),
            }
        }
        Err(misses) => f.residency_error = Some(misses.describe()),
    }
    f
}

//! One scan's worth of reading: which processes, which files of interest, which cgroups.
//!
//! Order of work keeps the cost proportional to what matters: `status`, `maps` and `fd` for
//! every process (cheap), then `smaps_rollup`, `smaps` (only the VMAs of files of interest),
//! `cmdline` and `cgroup` only for processes that hold a file of interest or were asked for.
//! A process that exits mid-scan is counted in `skipped.gone`; one whose private files are
//! refused (another user's, without root or `CAP_SYS_PTRACE`) in `skipped.denied`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::cgroup::CgroupReader;
use super::error::Result as CResult;
use super::process::{FdTarget, ProcReader, StatusRead};
use super::residency::{self, Method};
use super::{has_model_extension, system, Roots};
use crate::sample::{
    CgroupRef, FileKey, FileSample, MappingSample, OpenFileSample, ProcessSample, Sample,
    Unreadable,
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
        }
    }
}

/// A file of interest while gathering: how to open it and how to show it.
#[derive(Debug, Clone)]
struct Interest {
    shown: String,
    open_path: PathBuf,
    size_bytes: Option<u64>,
    explicit: bool,
}

struct Gatherer<'a> {
    procs: ProcReader,
    req: &'a Request,
    /// Decided files: `Some` = of interest, `None` = looked at and not of interest.
    decided: HashMap<FileKey, Option<Interest>>,
    warnings: &'a mut Vec<String>,
}

/// Reads everything a scan needs. Errors are for bad input (a missing path, an unknown
/// pid, an unreadable procfs root); a process's trouble is counted, never fatal.
pub fn gather(roots: &Roots, req: &Request, warnings: &mut Vec<String>) -> anyhow::Result<Sample> {
    let mut sample = Sample {
        system: system::read(&roots.proc)?,
        ..Sample::default()
    };
    let mut g = Gatherer {
        procs: ProcReader::new(&roots.proc),
        req,
        decided: HashMap::new(),
        warnings,
    };
    g.add_explicit_paths()?;

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
            if !g.procs.exists(*pid) {
                bail!("no process with pid '{pid}'");
            }
        }
        req.pids.clone()
    };

    // Phase 1, in parallel: status, maps and fds of every process (cheap).
    let procs = g.procs.clone();
    let basics = super::par_map(&pids, |pid| read_basic(&procs, *pid, only_cgroup.as_ref()));
    // Phase 2: which files are of interest (a stat per new file, cached), which
    // processes to keep.
    let mut kept = Vec::new();
    for (pid, basic) in pids.iter().zip(basics) {
        match basic {
            Ok(Some(b)) => {
                if let Some(k) = g.keep(*pid, b) {
                    kept.push(k);
                }
            }
            Ok(None) => {}
            Err(e) if e.is_gone() => sample.skipped.gone += 1,
            Err(e) if e.is_denied() => sample.skipped.denied += 1,
            Err(e) => g.warnings.push(format!("{:#}", anyhow::Error::from(e))),
        }
    }
    // Phase 3, in parallel: smaps (or smaps_rollup), cmdline and cgroup of the kept ones.
    let details = super::par_map(&kept, |k| read_detail(&procs, k));
    for detail in details {
        match detail {
            Ok(p) => {
                if p.unreadable == Some(Unreadable::Denied) {
                    sample.skipped.denied += 1;
                }
                sample.processes.push(p)
            }
            Err(e) if e.is_gone() => sample.skipped.gone += 1,
            Err(e) if e.is_denied() => sample.skipped.denied += 1,
            Err(e) => g.warnings.push(format!("{:#}", anyhow::Error::from(e))),
        }
    }
    if sample.skipped.denied > 0 {
        g.warnings.push(format!(
            "{} processes could not be read fully (their smaps, maps or fds need root or CAP_SYS_PTRACE): their files and PSS are unknown",
            sample.skipped.denied
        ));
    }

    sample.files = g.files();
    sample.cgroups = read_cgroups(&cgroups, &sample.processes, only_cgroup, g.warnings);
    Ok(sample)
}

/// What phase 1 reads of every process.
struct Basic {
    status: StatusRead,
    maps: Vec<MappingSample>,
    fds: Vec<FdTarget>,
    denied: bool,
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

/// Phase 1: `status`, `maps` and `fd` (the last two need ptrace read access).
fn read_basic(procs: &ProcReader, pid: i32, only: Option<&CgroupRef>) -> CResult<Option<Basic>> {
    if !in_cgroup(procs, pid, only)? {
        return Ok(None);
    }
    let status = procs.status(pid)?;
    let mut b = Basic {
        status,
        maps: Vec::new(),
        fds: Vec::new(),
        denied: false,
    };
    if b.status.kernel_thread {
        return Ok(Some(b));
    }
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
    Ok(Some(b))
}

/// Phase 3: one page-table walk per process: `smaps` when it maps a file of interest
/// (per-VMA values and the totals), else `smaps_rollup`.
fn read_detail(
    procs: &ProcReader,
    (p, wanted): &(ProcessSample, HashSet<FileKey>),
) -> CResult<ProcessSample> {
    let mut p = p.clone();
    if p.kernel_thread {
        return Ok(p);
    }
    let pid = p.pid;
    let mut denied = p.unreadable == Some(Unreadable::Denied);
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
    p.cmdline = procs.cmdline(pid).unwrap_or_default();
    p.cgroup = procs.cgroup(pid).ok().flatten();
    if denied {
        p.unreadable = Some(Unreadable::Denied);
    }
    Ok(p)
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
                self.walk(path)?;
            } else if meta.is_file() {
                self.insert_explicit(path, &meta);
            } else {
                let kind =
                    if meta.file_type().is_block_device() || meta.file_type().is_char_device() {
                        "a device"
                    } else {
                        "not a regular file or directory"
                    };
                bail!(
                    "'{}' is {kind}: give a model file or a directory",
                    path.display()
                );
            }
        }
        Ok(())
    }

    fn walk(&mut self, dir: &Path) -> anyhow::Result<()> {
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            let entries = match std::fs::read_dir(&d) {
                Ok(e) => e,
                Err(e) => {
                    self.warnings
                        .push(format!("skipping '{}': {e}", d.display()));
                    continue;
                }
            };
            for entry in entries.flatten() {
                let p = entry.path();
                let Ok(ft) = entry.file_type() else { continue };
                if ft.is_dir() {
                    stack.push(p);
                } else if ft.is_file() {
                    let Ok(meta) = entry.metadata() else { continue };
                    if has_model_extension(&p.to_string_lossy()) || meta.len() >= self.req.min_size
                    {
                        self.insert_explicit(&p, &meta);
                    }
                }
            }
        }
        Ok(())
    }

    fn insert_explicit(&mut self, path: &Path, meta: &std::fs::Metadata) {
        let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        self.decided.insert(
            FileKey::from_dev(meta.dev(), meta.ino()),
            Some(Interest {
                shown: abs.display().to_string(),
                open_path: abs,
                size_bytes: Some(meta.len()),
                explicit: true,
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
        code: bool,
    ) -> bool {
        if let Some(d) = self.decided.get(&key) {
            return d.is_some();
        }
        let root = self.procs.root().join(pid.to_string()).join("root");
        let open_path = root.join(path.trim_start_matches('/'));
        let size = size.or_else(|| std::fs::metadata(&open_path).ok().map(|m| m.len()));
        let interesting =
            has_model_extension(path) || (!code && size.is_some_and(|s| s >= self.req.min_size));
        let value = interesting.then(|| Interest {
            shown: path.to_string(),
            open_path,
            size_bytes: size,
            explicit: false,
        });
        self.decided.insert(key, value);
        interesting
    }

    /// Decides the files of interest of one process; `None` if it is not to be reported.
    fn keep(&mut self, pid: i32, b: Basic) -> Option<(ProcessSample, HashSet<FileKey>)> {
        let asked = self.req.pids.contains(&pid);
        let mut p = ProcessSample {
            pid,
            comm: b.status.comm,
            kernel_thread: b.status.kernel_thread,
            status: b.status.status,
            unreadable: b.denied.then_some(Unreadable::Denied),
            ..ProcessSample::default()
        };
        if p.kernel_thread {
            return (asked || self.req.all_processes).then_some((p, HashSet::new()));
        }
        let mut wanted = HashSet::new();
        let code: HashSet<FileKey> = b
            .maps
            .iter()
            .filter(|m| m.perms.exec)
            .map(|m| m.key())
            .collect();
        for m in &b.maps {
            if self.decide(pid, m.key(), &m.path, None, code.contains(&m.key())) {
                wanted.insert(m.key());
            }
        }
        for fd in b.fds {
            if self.decide(
                pid,
                fd.key,
                &fd.path,
                Some(fd.size_bytes),
                code.contains(&fd.key),
            ) {
                p.open_files.push(OpenFileSample {
                    fd: fd.fd,
                    key: fd.key,
                    path: fd.path,
                });
            }
        }
        let holds = !wanted.is_empty() || !p.open_files.is_empty();
        (holds || asked || self.req.all_processes).then_some((p, wanted))
    }

    /// Files of interest with their residency, largest first.
    fn files(&mut self) -> Vec<FileSample> {
        let mut by_key: BTreeMap<FileKey, Interest> = BTreeMap::new();
        for (k, v) in self.decided.drain() {
            if let Some(i) = v {
                by_key.insert(k, i);
            }
        }
        let mut out: Vec<FileSample> = by_key
            .into_iter()
            .map(|(key, i)| file_sample(key, i, self.req.residency))
            .collect();
        out.sort_by(|a, b| b.size_bytes.cmp(&a.size_bytes).then(a.path.cmp(&b.path)));
        out
    }
}

fn file_sample(key: FileKey, i: Interest, method: Method) -> FileSample {
    let mut f = FileSample {
        key,
        path: i.shown,
        size_bytes: i.size_bytes,
        residency: None,
        residency_error: None,
        explicit: i.explicit,
    };
    match residency::open(&i.open_path) {
        Ok((file, size)) => {
            // Same inode? A path may have been replaced since the process opened it.
            let same = file
                .metadata()
                .is_ok_and(|m| FileKey::from_dev(m.dev(), m.ino()) == key);
            if !same {
                f.residency_error = Some(format!(
                    "'{}' now names another file (the mapped one was replaced or deleted)",
                    i.open_path.display()
                ));
                return f;
            }
            f.size_bytes = Some(size);
            match residency::query(&file, &i.open_path, size, method) {
                Ok(r) => f.residency = Some(r),
                Err(e) => f.residency_error = Some(format!("{:#}", anyhow::Error::from(e))),
            }
        }
        Err(e) => f.residency_error = Some(format!("{:#}", anyhow::Error::from(e))),
    }
    f
}

//! Which files are of interest: those named (and the model files of directories named),
//! those a process maps or holds that have a model extension or are large enough (never
//! code by size alone), those named on a command line and the stores' model files; and
//! which processes a gather admits into its sample.

use crate::sample::Warning;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::answer::Place;
use super::cache::{self, BasicParts};
use super::decisions::{Decided, Interest};
use super::phases::Basic;
use super::process::ProcReader;
use super::reopen;
pub use super::reopen::raw_if_lossy;
use super::request::Request;
use super::{has_model_extension, Roots};
use crate::sample::{FileKey, FileSample, OpenFileSample, ProcessSample, Sample, Unreadable};

mod explicit;

/// A gather's state: the files decided so far, and what deciding them needs.
pub(super) struct Gatherer<'a> {
    pub(super) procs: ProcReader,
    req: &'a Request,
    /// Decided files: `Some` = of interest, `None` = looked at and not of interest.
    decided: HashMap<FileKey, Option<Interest>, foldhash::fast::RandomState>,
    /// (pid, file) pairs where the file is named on the process's command line.
    pub(super) named: HashSet<(i32, FileKey)>,
    /// The executable this process runs, to know twofold's own processes by.
    own_exe: Option<FileKey>,
    /// twofold's own processes: left out (see [`Gatherer::is_observer`]).
    pub(super) observers: Vec<i32>,
    /// The absolute paths of the files named by the user.
    explicit: HashSet<PathBuf>,
    /// `PROC/self/mountinfo`, read when a path must be resolved to the host's.
    own_mounts: Option<Option<String>>,
    /// What a long-lived engine decided before about the files processes map or hold,
    /// trusted for its maximum age (see [`Decided`]).
    pub(super) decisions: Decided,
    /// The walks of the directories named, kept by a long-lived engine (see
    /// [`super::walkmemo::WalkMemo`]).
    pub(super) walks: super::walkmemo::WalkMemo,
    pub(super) warnings: &'a mut Vec<Warning>,
    /// How many files of interest [`Gatherer::files`] looked at.
    pub(super) considered: u64,
    /// A fingerprint of the files of interest whatever the decisions (named, in stores):
    /// a process judged to hold nothing is judged again when they change.
    preset: u64,
}

impl<'a> Gatherer<'a> {
    pub(super) fn new(roots: &Roots, req: &'a Request, warnings: &'a mut Vec<Warning>) -> Self {
        Gatherer {
            procs: ProcReader::new(&roots.proc),
            req,
            decided: HashMap::default(),
            named: HashSet::new(),
            own_exe: own_exe(&roots.proc),
            observers: Vec::new(),
            explicit: HashSet::new(),
            own_mounts: None,
            decisions: Decided::default(),
            walks: super::walkmemo::WalkMemo::default(),
            warnings,
            considered: 0,
            preset: 0,
        }
    }

    /// Takes the fingerprint of the files decided before any process is looked at (the
    /// files named and those of the stores), for [`Decided::quiet`].
    pub(super) fn seal_preset(&mut self) {
        use std::hash::{Hash, Hasher};
        let mut keys: Vec<FileKey> = self.decided.keys().copied().collect();
        keys.sort_unstable();
        let mut h = std::hash::DefaultHasher::new();
        keys.hash(&mut h);
        self.preset = h.finish();
    }

    /// Classifies a file a process maps or holds: of interest or not (once per file).
    /// Code (a file some process maps executable: programs, shared libraries such as a
    /// 1 GiB `libtorch_cuda.so`) is never a model by size alone, and anonymous shared
    /// memory ([`crate::sample::places::anonymous_shared`]) never at all.
    fn classify(
        &mut self,
        pid: i32,
        key: FileKey,
        path: &str,
        size: Option<u64>,
        mapped: Option<(u64, u64)>,
        code: bool,
    ) -> bool {
        // Anonymous shared memory (`/dev/zero (deleted)`, `/SYSV…`, `/anon_hugepage`) has
        // an inode on an internal mount but is no file: searched as the process's memory.
        if key.major == 0 && crate::sample::places::anonymous_shared(path) {
            return false;
        }
        if let Some(d) = self.decided.get(&key) {
            return d.is_some();
        }
        let path_hash = xxhash_rust::xxh3::xxh3_64(path.as_bytes()) ^ u64::from(code);
        if let Some(value) = self.decisions.get(key, path_hash) {
            let interesting = value.is_some();
            self.decided.insert(key, value);
            return interesting;
        }
        // The inode itself through its map_files entry, for a mapping.
        let alt = mapped.map(|(start, end)| reopen::map_file(self.procs.root(), pid, start, end));
        // Never through a path with " (deleted)" appended; the inode itself through `alt`
        // (its map_files or fd) when the path is gone or names another one.
        let open_path = reopen::in_root(self.procs.root(), pid, path);
        // An overlay file's bytes are in the file below it ([`super::overlay`]).
        let real = (!path.ends_with(reopen::DELETED))
            .then(|| self.procs.overlays().real_at(pid, path))
            .flatten()
            .map(|r| r.path);
        // A mapping's size from its `map_files` link with the attributes its filesystem
        // has cached (nothing is asked of it, so a hung mount answers too); else by path,
        // under the deadline.
        let cached = alt
            .as_ref()
            .and_then(|a| super::answer::stat_cached(a).ok())
            .filter(|st| FileKey::from_dev(st.st_dev, st.st_ino) == key)
            .map(|st| st.st_size as u64);
        let size = size.or(cached).or_else(|| {
            [Some(&open_path), alt.as_ref(), real.as_ref()]
                .into_iter()
                .flatten()
                .filter_map(|p| super::answer::metadata(Place::of_key(key), p).ok()?.ok())
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
            named: false,
        });
        self.decisions.note(key, path_hash, value.clone());
        self.decided.insert(key, value);
        interesting
    }

    /// The host path of the file `key` that process `pid` names `path`: `path` itself
    /// when it is that file here, else through the process's mounts
    /// ([`super::mounts::host_candidates`]); `None` when the host has no name for it.
    fn host_path(&mut self, pid: i32, key: FileKey, path: &str) -> Option<PathBuf> {
        let p = Path::new(path);
        // Under the deadline: a hung mount answers "not this one" (the name shown is then
        // the process's own).
        let is_it = |p: &Path| {
            super::answer::metadata(Place::of_key(key), p)
                .is_ok_and(|m| m.is_ok_and(|m| reopen::identity(&m) == key))
        };
        if !p.is_absolute() {
            return None;
        }
        if is_it(p) {
            return Some(p.to_path_buf());
        }
        // An overlay file: the file that holds its bytes (its identity is that one's).
        if let Some(r) = self.procs.overlays().real_at(pid, path) {
            return (r.key == key).then_some(r.path);
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

    /// Admits one process into the sample (classifying the files it maps and holds): `Ok`
    /// to report it, `Err(Some)` for a process that holds nothing (it may still hold a
    /// copy), `Err(None)` to drop it.
    #[allow(clippy::result_large_err)]
    pub(super) fn admit(
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
        // Judged before on the same parts, under the same decisions: nothing of interest.
        let quiet = self.decisions.quiet(pid, &b.parts, self.preset);
        // Few per process (a program and its libraries): a list beats a hash set.
        let files = b.parts.mapped_files();
        let code = &files.code;
        // The first mapping of each file decides it (later ones find it decided).
        for &i in files.first.iter().filter(|_| !quiet) {
            let m = &b.parts.maps[i as usize];
            let range = Some((m.start, m.end));
            let is_code = code.binary_search(&m.key()).is_ok();
            if self.classify(pid, m.key(), &m.path, None, range, is_code) {
                wanted.insert(m.key());
            }
        }
        for fd in b.parts.fds.iter().filter(|_| !quiet) {
            if self.classify(
                pid,
                fd.key,
                &fd.path,
                Some(fd.size_bytes),
                None,
                code.binary_search(&fd.key).is_ok(),
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
        if !quiet {
            self.decisions.set_quiet(pid, &b.parts, self.preset, !holds);
        }
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
        if pid == self.procs.own_pid() {
            return true;
        }
        if parts.observer || another_build(&parts.cmdline) {
            return true;
        }
        let Some(exe) = self.own_exe else {
            return false;
        };
        parts.mapped_files().code.binary_search(&exe).is_ok()
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
                    named: false,
                })
            });
            if self.decided.get(&n.key).is_some_and(|d| d.is_some()) {
                self.named.insert((pid, n.key));
            }
        }
    }

    /// Model files of the well-known stores (see [`super::stores`]).
    pub(super) fn add_store_files(&mut self) {
        let dirs = super::stores::dirs(|k| std::env::var_os(k));
        let (found, hung) = super::stores::model_files(&dirs);
        for e in hung {
            self.warnings.push(Warning::new(
                crate::sample::WarningKind::FileSkipped,
                e.path.display().to_string(),
                format!("model store not read: {e}"),
            ));
        }
        for (path, key, size) in found {
            self.decided.entry(key).or_insert_with(|| {
                Some(Interest {
                    shown: path.display().to_string(),
                    raw: raw_if_lossy(&path),
                    open_path: path,
                    size_bytes: Some(size),
                    explicit: false,
                    store: true,
                    named: false,
                })
            });
        }
    }

    /// Sizes of the files of interest known so far.
    pub(super) fn interest_sizes(&self) -> Vec<(FileKey, u64)> {
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
    /// Named processes without named files: the whole host's files of interest are
    /// looked at for them (`scan --pid P`).
    pub(super) fn host_wide(&self) -> bool {
        self.req.host_files
            && !self.req.pids.is_empty()
            && !self.req.only_paths
            && self.req.candidates
    }

    /// `held`: the files a long-lived engine keeps open ([`super::heldfiles`]), measured
    /// through those descriptors, and told what this snapshot measured.
    pub(super) fn files(
        &mut self,
        sample: &Sample,
        mut held: Option<&mut super::heldfiles::HeldFiles>,
    ) -> Vec<FileSample> {
        let mut by_key: BTreeMap<FileKey, Interest> = BTreeMap::new();
        for (k, v) in self.decided.drain() {
            if let Some(i) = v {
                by_key.insert(k, i);
            }
        }
        // Which processes map or hold each file, once (rather than every process's
        // mappings searched for each file).
        let refs = crate::sample::referrers(&sample.processes);
        let candidates: HashSet<FileKey> = sample.candidates.iter().map(|c| c.file).collect();
        let referenced = |k: &FileKey| refs.contains_key(k) || candidates.contains(k);
        // `scan --pid P`: the host's files of interest, of which those P maps, holds or
        // could hold a copy of are kept (its candidates: it read enough, or names them).
        let host_wide = self.host_wide();
        self.considered = by_key.len() as u64;
        let mut out: Vec<FileSample> = by_key
            .into_iter()
            .filter(|(k, i)| (!i.store && !host_wide) || referenced(k))
            .map(|(key, i)| {
                let holders = refs
                    .get(&key)
                    .map_or(&[][..], Vec::as_slice)
                    .iter()
                    .map(|&i| &sample.processes[i]);
                let kept = held.as_ref().and_then(|h| h.get(key));
                let ways = match kept {
                    Some(_) => Vec::new(),
                    None => reopen::ways_among(
                        self.procs.root(),
                        holders.clone(),
                        key,
                        Some(&i.open_path),
                    ),
                };
                let mapped = super::measure::mapped_bytes(holders.clone(), key);
                let now = (kept, held.as_ref().and_then(|h| h.pages(key)));
                let (mut f, opened) =
                    super::measure::file_sample(key, i, ways, self.req.residency, mapped, now);
                if let Some(h) = held.as_deref_mut() {
                    h.measured(key, opened);
                }
                f.seen_as = seen_as(holders, key, &f.path);
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
/// twofold's commands that observe (everything but the `__child` workloads and `__bench`).
const OBSERVING: &[&str] = &[
    "scan",
    "residency",
    "dupes",
    "run",
    "compare",
    "pressure",
    "demo",
    "inspect",
    "trace",
    "probe",
    "top",
    "record",
    "replay",
    "dump",
    "snapshot",
    "serve",
];

/// A twofold of another build or path (another checkout's `serve`, the DaemonSet's image
/// beside an admin's binary): a program named `twofold` running one of its observing
/// commands. Its executable is another inode, but what it maps or holds is there because
/// it observes (its index keeps model files open), never a holder's.
fn another_build(cmdline: &[String]) -> bool {
    let named = cmdline
        .first()
        .and_then(|a| Path::new(a).file_name())
        .is_some_and(|n| n == "twofold");
    named
        && cmdline
            .get(1)
            .is_some_and(|c| OBSERVING.contains(&c.as_str()))
}

fn own_exe(proc_root: &Path) -> Option<FileKey> {
    let m = std::fs::metadata(proc_root.join("self").join("exe")).ok()?;
    Some(FileKey::from_dev(m.dev(), m.ino()))
}

/// The names processes give the file `key` other than `shown` (sorted, once each).
fn seen_as<'a>(
    processes: impl Iterator<Item = &'a ProcessSample>,
    key: FileKey,
    shown: &str,
) -> Vec<String> {
    let shown = reopen::strip_deleted(shown);
    let mut out: Vec<String> = processes
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

#[cfg(test)]
mod tests {
    use super::another_build;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn another_build_is_known_by_its_program_and_command() {
        assert!(another_build(&v(&[
            "/opt/other/target/release/twofold",
            "serve",
            "--listen",
            "x"
        ])));
        assert!(another_build(&v(&["twofold", "record", "--store", "s"])));
        // Its readers are workloads, and a program of another name is not twofold.
        assert!(!another_build(&v(&[
            "/usr/bin/twofold",
            "__child",
            "copy",
            "m"
        ])));
        assert!(!another_build(&v(&["/usr/bin/python3", "serve"])));
        assert!(!another_build(&v(&["twofold"])));
        assert!(!another_build(&[]));
    }
}

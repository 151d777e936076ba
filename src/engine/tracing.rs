//! The engine's eBPF tracing: attach and detach ([`Engine::set_tracing`]), read the
//! counters with a snapshot or alone ([`Engine::trace_sample`], what `trace` runs on), fold
//! away processes that exited, and name at collection time what a model of the counters
//! shows ([`crate::model::trace::shown`]): the views build no model to find names.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use super::Engine;
use crate::collect::bpf::{TraceOptions, Tracer};
use crate::collect::gather::Request;
use crate::collect::names::Names;
use crate::model;
use crate::model::trace::TraceContext;
use crate::sample::trace::{TraceNames, TraceSample};
use crate::sample::{FileKey, Warning, WarningKind};

/// What the engine keeps while tracing: the tracer, what it pinned, names it resolved and
/// the sample before.
pub(super) struct Tracing {
    /// `None` once a one-shot window ([`Engine::trace_once`]) has been read, and when
    /// only uploads are traced ([`Engine::set_upload_tracing`]).
    pub(super) tracer: Option<Tracer>,
    /// Detach right after the next sample.
    pub(super) once: bool,
    pinned: BTreeSet<FileKey>,
    names: Names,
    prev: Option<TraceSample>,
    /// Non-fatal attach problems, reported with the next snapshot.
    warnings: Vec<Warning>,
    /// The upload probes on the CUDA driver library, when they could be attached.
    pub(super) uploads: Option<super::uploads::Uploads>,
    /// The per-process counters of the last sample, as read (see [`fold_exited`]).
    before: Option<PerProcess>,
    /// Bytes read per file by processes folded away since the attach.
    exited_read: BTreeMap<FileKey, u64>,
    /// Whether processes that exited stay in the counters (`trace`'s summary since the
    /// attach lists every process that read a model), or are folded away ([`fold_exited`]:
    /// a long recording's frames hold the living and the recently exited).
    keep_exited: bool,
    /// How many rows a model of the counters shows beside the files of interest (names
    /// are looked up for those).
    top: usize,
    /// Whether each pid that read a file is another twofold (it carries the observer
    /// mark), looked up once per pid.
    observers: BTreeMap<i32, bool>,
}

type PerProcess = (
    BTreeMap<i32, crate::sample::trace::PidCounters>,
    BTreeMap<(i32, FileKey), crate::sample::trace::IoCounters>,
);

impl Engine {
    /// Whether tracing is on.
    pub fn tracing(&self) -> bool {
        self.tracing.is_some()
    }

    /// Turns eBPF tracing on (attaching the programs, pinning the request's files and
    /// processes) or off (detaching them). Snapshots carry the counters while it is on;
    /// counters start from zero at each attach. `Err` says why it cannot be turned on (no
    /// privilege, no tracepoint), in words for people; the engine goes on without it.
    pub fn set_tracing(&mut self, on: bool) -> Result<(), String> {
        if !on {
            self.tracing = None;
            return Ok(());
        }
        self.start_tracing(false)
    }

    /// Traces uploads to GPUs alone: the upload probes on the CUDA driver library, without
    /// the page-fault, syscall and page-cache tracepoints of [`Engine::set_tracing`] (whose
    /// cost every page fault and read() pays). Snapshots carry the upload ledger and no
    /// counters. `Err` when the upload probes cannot be attached. A no-op when tracing
    /// is on already.
    pub fn set_upload_tracing(&mut self) -> Result<(), String> {
        self.start_tracing(true)
    }

    /// Keeps the upload ledger where the host's other twofold processes read it (a
    /// resident tracer: `serve`, `record`; `command` names it), while uploads are traced.
    /// Returns the ledger file (`None`: uploads are not traced).
    pub fn publish_uploads(&mut self, command: &str) -> Result<Option<std::path::PathBuf>, String> {
        let dir = crate::collect::hostledger::ledger_dir();
        match self.tracing.as_mut().and_then(|t| t.uploads.as_mut()) {
            Some(u) => u.publish(&dir, command).map(Some),
            None => Ok(None),
        }
    }

    fn start_tracing(&mut self, uploads_only: bool) -> Result<(), String> {
        if self.tracing.is_some() {
            return Ok(());
        }
        let mut files = explicit_keys(&self.req.paths);
        files.extend(self.interest.iter().map(|f| f.0));
        files.sort();
        files.dedup();
        let tracer = if uploads_only {
            None
        } else {
            Some(
                Tracer::attach(&TraceOptions::pinning(&self.req.pids, &files))
                    .map_err(|e| format!("{:#}", anyhow::Error::from(e)))?,
            )
        };
        let mut warnings = tracer
            .as_ref()
            .map_or(Vec::new(), |t| t.warnings().to_vec());
        let named: Vec<(std::path::PathBuf, FileKey)> = self
            .req
            .paths
            .iter()
            .filter_map(|p| {
                let m = stat_within(p).filter(|m| m.is_file())?;
                Some((p.clone(), FileKey::from_dev(m.dev(), m.ino())))
            })
            .collect();
        let uploads = match super::uploads::Uploads::start(&self.roots, &named) {
            Ok((u, w)) => {
                warnings.extend(w.into_iter().map(upload_warning));
                Some(u)
            }
            Err(e) if uploads_only => return Err(e),
            Err(e) => {
                warnings.push(upload_warning(format!(
                    "uploads to GPUs are not traced: {e}"
                )));
                None
            }
        };
        self.tracing = Some(Tracing {
            uploads,
            warnings,
            tracer,
            once: false,
            pinned: files.into_iter().collect(),
            names: Names::new(&self.roots, BTreeMap::new()),
            prev: None,
            before: None,
            exited_read: BTreeMap::new(),
            keep_exited: false,
            top: model::TRACE_TOP,
            observers: BTreeMap::new(),
        });
        Ok(())
    }

    /// Turns tracing on for one window: the next snapshot carries the counters since now
    /// and detaches the programs as soon as it has read them, before collecting (so a
    /// one-shot scan's own collection and proof run untraced, as fast as without it).
    pub fn trace_once(&mut self) -> Result<(), String> {
        self.set_tracing(true)?;
        if let Some(t) = self.tracing.as_mut() {
            t.once = true;
        }
        Ok(())
    }

    /// Counters the tracer could not attach, with the reason (empty when tracing is off).
    pub fn trace_unavailable(&self) -> BTreeMap<crate::sample::trace::Counter, String> {
        self.tracing
            .as_ref()
            .and_then(|t| t.tracer.as_ref())
            .map(|t| t.unavailable().clone())
            .unwrap_or_default()
    }

    /// `trace`'s mode: processes that exited stay in the counters (the summary since the
    /// attach lists every process that read a file), and models show `top` rows beside
    /// the files of interest, whose names are looked up with each sample.
    pub fn trace_rows(&mut self, top: usize) {
        if let Some(t) = self.tracing.as_mut() {
            t.keep_exited = true;
            t.top = top;
        }
    }

    /// How long attaching the programs took (`None` when tracing is off).
    pub fn trace_attach_time(&self) -> Option<Duration> {
        let t = self.tracing.as_ref()?.tracer.as_ref()?;
        Some(t.attach_time())
    }

    /// The counters now, without a collection (what `trace` prints every interval): the
    /// files of interest are those of the last snapshot; what the rows show is named.
    /// `None` when tracing is off. Attach problems not yet said are appended to `warnings`.
    /// The upload ledger comes with them (when uploads are traced), the files of interest
    /// indexed, each process with its GPUs (NVML is asked only once a copy was seen).
    pub fn trace_sample(&mut self, warnings: &mut Vec<Warning>) -> Option<TraceSample> {
        let t = self.tracing.as_mut()?;
        t.take_warnings(warnings);
        let mut cur = t.read(&self.roots.proc, &self.req, &self.interest, warnings)?;
        if let Some(u) = t.uploads.as_mut() {
            let gpu = if u.any_copies() {
                let mut g = crate::collect::gpu::sample(self.gpu.as_mut(), &self.roots.proc);
                crate::collect::gpu::settle(self.gpu.as_mut(), &mut g);
                g
            } else {
                Default::default()
            };
            let files: Vec<(std::path::PathBuf, FileKey)> = self
                .interest
                .iter()
                .map(|(k, p)| (std::path::PathBuf::from(p), *k))
                .collect();
            let mut said = Vec::new();
            cur.uploads = Some(u.ledger(&files, &gpu, &mut said));
            warnings.extend(said.into_iter().map(upload_warning));
        }
        Some(cur)
    }

    /// Reads the counters for a snapshot (after its collection and proof), named.
    pub(super) fn trace_for_snapshot(
        &mut self,
        warnings: &mut Vec<Warning>,
    ) -> Option<TraceSample> {
        let t = self.tracing.as_mut()?;
        t.read(&self.roots.proc, &self.req, &self.interest, warnings)
    }
}

/// A problem of the upload probes, as a warning of its own (its sentence its subject).
pub(super) fn upload_warning(text: String) -> Warning {
    Warning::new(WarningKind::Trace, text.clone(), text)
}

impl Tracing {
    /// Moves the attach problems not yet said to `warnings`.
    pub(super) fn take_warnings(&mut self, warnings: &mut Vec<Warning>) {
        warnings.append(&mut self.warnings);
    }

    /// The counters now, with exited processes folded away (unless kept) and named.
    fn read(
        &mut self,
        proc_root: &std::path::Path,
        req: &Request,
        files: &[(FileKey, String)],
        warnings: &mut Vec<Warning>,
    ) -> Option<TraceSample> {
        let tracer = self.tracer.as_mut()?;
        let mut cur = tracer.sample();
        // The engine's own reads (indexing a model file for the proof or for matching
        // uploads) are the observer's, not the host's: they are left out of every count.
        let me = std::process::id() as i32;
        cur.pids.remove(&me);
        cur.io.retain(|(pid, _), _| *pid != me);
        // So are another twofold's (an exporter, a recorder of another build): its reads
        // of a model are an observer's, never a loader's.
        let readers: BTreeSet<i32> = cur.io.keys().map(|k| k.0).collect();
        self.observers.retain(|p, _| readers.contains(p));
        for pid in readers {
            let observer = *self.observers.entry(pid).or_insert_with(|| {
                std::fs::read_to_string(proc_root.join(pid.to_string()).join("maps"))
                    .is_ok_and(|m| crate::collect::observer::marked(&m))
            });
            if observer {
                cur.pids.remove(&pid);
                cur.io.retain(|(p, _), _| *p != pid);
            }
        }
        if !self.keep_exited {
            fold_exited(
                proc_root,
                tracer,
                &mut self.before,
                &mut self.exited_read,
                &mut cur,
            );
        }
        self.annotate(req, files, &mut cur, warnings);
        Some(cur)
    }
}

/// Forgets the processes that exited before the last sample and did nothing since: their
/// counters leave the sample and the kernel's maps ([`Tracer::forget`]), and what they read
/// of each file is kept in `exited` (the sample's `exited_read_bytes`), so that per-file
/// totals and rates stay whole. A process that exits shows in the one sample after its
/// last event, then only in the per-file totals: a recording's frames hold the living and
/// the recently exited, not every process since the attach.
fn fold_exited(
    proc_root: &std::path::Path,
    tracer: &mut Tracer,
    before: &mut Option<PerProcess>,
    exited: &mut BTreeMap<FileKey, u64>,
    cur: &mut TraceSample,
) {
    if let Some((pids, io)) = before.as_ref() {
        let idle_pids: Vec<i32> = cur
            .pids
            .iter()
            .filter(|(p, c)| pids.get(p) == Some(c))
            .map(|(p, _)| *p)
            .collect();
        let idle_io: Vec<(i32, FileKey)> = cur
            .io
            .iter()
            .filter(|(k, c)| io.get(k) == Some(c))
            .map(|(k, _)| *k)
            .collect();
        if !idle_pids.is_empty() || !idle_io.is_empty() {
            // Processes (counters are kept per thread-group id, as /proc lists them);
            // when /proc cannot be listed, nobody is taken for gone.
            let alive: std::collections::HashSet<i32> =
                match crate::collect::process::ProcReader::new(proc_root).pids() {
                    Ok(pids) => pids.into_iter().collect(),
                    Err(_) => cur
                        .pids
                        .keys()
                        .chain(cur.io.keys().map(|k| &k.0))
                        .copied()
                        .collect(),
                };
            let gone_pids: Vec<i32> = idle_pids
                .into_iter()
                .filter(|p| !alive.contains(p))
                .collect();
            let gone_io: Vec<(i32, FileKey)> = idle_io
                .into_iter()
                .filter(|(p, _)| !alive.contains(p))
                .collect();
            for p in &gone_pids {
                cur.pids.remove(p);
            }
            for k in &gone_io {
                if let Some(c) = cur.io.remove(k) {
                    let e = exited.entry(k.1).or_default();
                    *e = e.saturating_add(c.read_bytes);
                }
            }
            tracer.forget(&gone_pids, &gone_io);
        }
    }
    *before = Some((cur.pids.clone(), cur.io.clone()));
    cur.exited_read_bytes = exited.clone();
}

/// (dev, inode) of the request's paths that are files (directories' model files are
/// pinned once collection finds them).
fn explicit_keys(paths: &[std::path::PathBuf]) -> Vec<FileKey> {
    paths
        .iter()
        .filter_map(|p| stat_within(p))
        .filter(|m| m.is_file())
        .map(|m| FileKey::from_dev(m.dev(), m.ino()))
        .collect()
}

/// `stat(2)` of a path named, under the deadline (`collect::answer`).
fn stat_within(p: &std::path::Path) -> Option<std::fs::Metadata> {
    let place = crate::collect::answer::Place::of(p);
    crate::collect::answer::metadata(place, p).ok()?.ok()
}

impl Tracing {
    /// Pins the files of interest collection found, and names what a report of `cur`
    /// (with the sample before it, or without) would show that the sample does not name.
    pub(super) fn annotate(
        &mut self,
        req: &Request,
        files: &[(FileKey, String)],
        cur: &mut TraceSample,
        warnings: &mut Vec<Warning>,
    ) {
        let new: Vec<FileKey> = files
            .iter()
            .map(|f| f.0)
            .filter(|k| !self.pinned.contains(k))
            .collect();
        if let (false, Some(tracer)) = (new.is_empty(), self.tracer.as_mut()) {
            match tracer.pin_files(&new) {
                Ok(()) => self.pinned.extend(new),
                Err(e) => warnings.push(Warning::host(
                    WarningKind::Trace,
                    format!("--trace: {:#}", anyhow::Error::from(e)),
                )),
            }
        }
        cur.pinned_pids = req.pids.clone();
        // The widest context a report can have: every file of the sample is of interest
        // (a report keeps a subset), so every row a report shows is a row here too.
        let mut ctx = TraceContext {
            paths: files.iter().cloned().collect(),
            interest: files.iter().map(|f| f.0).collect(),
            pids: req.pids.clone(),
            top: self.top,
            ..TraceContext::default()
        };
        for (k, p) in self.names.paths() {
            ctx.paths.entry(*k).or_insert_with(|| p.clone());
        }
        let prev = self
            .prev
            .as_ref()
            .filter(|p| crate::sample::trace::same_attachment(p, cur));
        let (mut keys, pids) = crate::model::trace::shown(cur, prev, &ctx);
        let named: BTreeSet<FileKey> = files.iter().map(|f| f.0).collect();
        keys.retain(|k| !named.contains(k));
        self.names.resolve_paths(&keys);
        self.names.resolve_comms(&pids);
        cur.names = TraceNames {
            paths: keys
                .iter()
                .filter_map(|k| Some((*k, self.names.paths().get(k)?.clone())))
                .collect(),
            comms: pids
                .iter()
                .filter_map(|p| Some((*p, self.names.comms().get(p)?.clone())))
                .collect(),
        };
        self.prev = Some(cur.clone());
    }
}

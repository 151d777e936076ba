//! The engine's side of upload tracing: the [`UploadTracer`]'s records are matched, as
//! they come, against the model files' grid ([`Matcher`]) and kept as a ledger per
//! process and file; each snapshot carries the ledger as an [`UploadsSample`].
//!
//! Copies that matched no file are kept (at most [`PENDING_BYTES`] of samples) and
//! matched again when collection finds new model files: a loader may upload before its
//! file is known to be a model file.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::ledger::Ledger;
use crate::collect::bpf::uploads::{Note, UploadTracer};
use crate::collect::hostledger::Publisher;
use crate::collect::Roots;
use crate::dupes::uploads::Matcher;
use crate::sample::uploads::UploadsSample;
use crate::sample::GpuSample;
use crate::sample::{FileKey, Sample};

/// Upload tracing while the engine traces.
pub(crate) struct Uploads {
    _tracer: UploadTracer,
    ledger: Arc<Mutex<Ledger>>,
    indexed: BTreeSet<FileKey>,
    /// The thread that keeps the ledger where the host's other twofold processes read it
    /// (a resident tracer), and its stop flag.
    publishing: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
}

impl Drop for Uploads {
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.publishing.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = thread.join();
        }
    }
}

/// How often a resident tracer writes its ledger (when it changed).
const PUBLISH_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Each process of `s` with the GPUs `gpu` says it holds memory on.
pub(crate) fn with_gpus(s: &mut UploadsSample, gpu: &GpuSample) {
    for p in &mut s.processes {
        p.gpus = gpu
            .devices
            .iter()
            .filter(|d| d.processes.iter().any(|g| g.pid == p.pid))
            .map(|d| d.info.index)
            .collect();
    }
}

impl Uploads {
    /// Attaches the upload probes; `files` (path, key) are indexed at once so that
    /// uploads during the window are matched as they come.
    pub(crate) fn start(
        roots: &Roots,
        files: &[(PathBuf, FileKey)],
    ) -> Result<(Uploads, Vec<String>), String> {
        let ledger = Arc::new(Mutex::new(Ledger {
            proc_root: roots.proc.clone(),
            ..Ledger::default()
        }));
        let (matcher, mut warnings) = Matcher::build(files);
        let indexed: BTreeSet<FileKey> = files.iter().map(|f| f.1).collect();
        if let Some(m) = matcher {
            lock(&ledger).set_matcher(Arc::new(m));
        }
        let sink_ledger = ledger.clone();
        let sink = Box::new(move |n: Note| lock(&sink_ledger).note(n));
        let objects = std::env::var_os(crate::collect::bpf::OBJECTS_ENV).map(PathBuf::from);
        let tracer = UploadTracer::attach(objects.as_deref(), &roots.proc, sink)
            .map_err(|e| format!("{:#}", anyhow::Error::from(e)))?;
        warnings.extend(tracer.warnings().iter().cloned());
        if tracer.libraries() == 0 {
            lock(&ledger).sample.unavailable = Some(
                "no CUDA driver library (libcuda.so*) loaded or installed yet; processes that load one later are traced"
                    .into(),
            );
        }
        Ok((
            Uploads {
                _tracer: tracer,
                ledger,
                indexed,
                publishing: None,
            },
            warnings,
        ))
    }

    /// Keeps the ledger in `dir` for the host's other twofold processes (`command` names
    /// this one): written within [`PUBLISH_EVERY`] of each change, removed when tracing
    /// stops. Returns the file.
    pub(crate) fn publish(
        &mut self,
        dir: &std::path::Path,
        command: &str,
    ) -> Result<PathBuf, String> {
        if self.publishing.is_some() {
            return Err("the upload ledger is published already".into());
        }
        let proc_root = lock(&self.ledger).proc_root.clone();
        let publisher = Publisher::create(dir, &proc_root, command)
            .map_err(|e| format!("cannot keep the upload ledger in '{}': {e}", dir.display()))?;
        let path = publisher.path().to_path_buf();
        let stop = Arc::new(AtomicBool::new(false));
        let (ledger, stop2) = (self.ledger.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("twofold-ledger".into())
            .spawn(move || {
                let mut first = true;
                while !stop2.load(Ordering::Relaxed) {
                    let snap = {
                        let mut l = lock(&ledger);
                        l.forget_exited();
                        let changed = std::mem::take(&mut l.changed);
                        (changed || first).then(|| l.snapshot())
                    };
                    if let Some(s) = snap {
                        if let Err(e) = publisher.write(&s) {
                            eprintln!("twofold: warning: {e}");
                        }
                        first = false;
                    }
                    std::thread::sleep(PUBLISH_EVERY);
                }
                drop(publisher);
            })
            .map_err(|e| format!("cannot start the ledger writer: {e}"))?;
        self.publishing = Some((stop, thread));
        Ok(path)
    }

    /// Indexes model files of `sample` not indexed yet, and returns the ledger, each
    /// process with the GPUs it holds memory on.
    /// Processes that exited are forgotten first.
    pub(crate) fn sample(&mut self, sample: &Sample, warnings: &mut Vec<String>) -> UploadsSample {
        lock(&self.ledger).forget_exited();
        let proc_root = lock(&self.ledger).proc_root.clone();
        // Opened through a way that reaches the inode (a memfd or an unlinked file has no
        // path: its holders' map_files or fd), as the proof opens them.
        let files: Vec<(PathBuf, FileKey)> = sample
            .files
            .iter()
            // Never a file the collection did not open (a filesystem that did not answer in
            // time, or FUSE, where opening a file drops its page cache), as the proof.
            .filter(|f| f.size_bytes.is_some() && f.unopened.is_none())
            .map(|f| {
                let shown = std::path::Path::new(&f.path);
                let ways =
                    crate::collect::reopen::ways(&proc_root, &sample.processes, f.key, Some(shown));
                let way = crate::collect::reopen::first_way(&ways, f.key).map_or(shown, |w| w.0);
                (way.to_path_buf(), f.key)
            })
            .collect();
        self.ledger(&files, &sample.gpu, warnings)
    }

    /// Indexes `files` (path, key) when one is not indexed yet, and returns the ledger,
    /// each process with the GPUs `gpu` says it holds memory on.
    pub(crate) fn ledger(
        &mut self,
        files: &[(PathBuf, FileKey)],
        gpu: &GpuSample,
        warnings: &mut Vec<String>,
    ) -> UploadsSample {
        if files.iter().any(|f| !self.indexed.contains(&f.1)) {
            // Every file again: one grid holds them all (indexing reads only its points).
            let (m, w) = Matcher::build(files);
            warnings.extend(w);
            self.indexed = files.iter().map(|f| f.1).collect();
            if let Some(m) = m {
                lock(&self.ledger).set_matcher(Arc::new(m));
            }
        }
        let mut s = {
            let mut l = lock(&self.ledger);
            let pids: Vec<i32> = l.procs.keys().copied().collect();
            for pid in pids {
                if let Some(g) = crate::model::device::only_gpu_in(gpu, pid) {
                    l.last_gpu.insert(pid, g);
                }
            }
            l.snapshot()
        };
        if !s.libraries.is_empty() {
            s.unavailable = None;
        }
        with_gpus(&mut s, gpu);
        s
    }

    /// Whether any host-to-device copy was seen.
    pub(crate) fn any_copies(&self) -> bool {
        lock(&self.ledger).procs.values().any(|p| p.row.copies > 0)
    }
}

fn lock(l: &Mutex<Ledger>) -> std::sync::MutexGuard<'_, Ledger> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

//! The engine's side of upload tracing: the [`UploadTracer`]'s records are matched, as
//! they come, against the model files' grid ([`Matcher`]) and kept as a ledger per
//! process and file; each snapshot carries the ledger as an [`UploadsSample`].
//!
//! Copies that matched no file are kept (at most [`PENDING_BYTES`] of samples) and
//! matched again when collection finds new model files: a loader may upload before its
//! file is known to be a model file.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::collect::bpf::uploads::{entry_name, Call, CopyRecord, Note, UploadTracer, SAMPLES};
use crate::collect::Roots;
use crate::dupes::uploads::{add_range, Matcher};
use crate::sample::uploads::{
    FileUpload, HostRegistration, RetiredUpload, UploadProcess, UploadsSample,
};
use crate::sample::GpuSample;
use crate::sample::{FileKey, Sample};

/// Samples of unmatched copies kept for a later match.
pub const PENDING_BYTES: usize = 16 << 20;

/// Where the last copy of a process matched as is ended: in the file, at the source and at
/// the destination (a chunk that continues it is confirmed at `file_end`).
#[derive(Clone, Copy)]
struct Follow {
    file: FileKey,
    file_end: u64,
    src_end: u64,
    dst_end: u64,
}

#[derive(Default)]
struct Proc {
    row: UploadProcess,
    last: Option<Follow>,
    /// Live device allocations: start → bytes.
    allocs: BTreeMap<u64, u64>,
    host: BTreeMap<u64, u64>,
}

#[derive(Default)]
struct Ledger {
    matcher: Option<Arc<Matcher>>,
    proc_root: PathBuf,
    sample: UploadsSample,
    procs: BTreeMap<i32, Proc>,
    uploads: BTreeMap<(i32, FileKey, bool), FileUpload>,
    pending: VecDeque<(i32, u64, CopyRecord)>,
    pending_bytes: usize,
    /// Processes that mapped an attached library since before it was attached.
    preloaded: BTreeSet<i32>,
    /// The one GPU each process was last seen holding memory on (NVML).
    last_gpu: BTreeMap<i32, u32>,
    /// Device bytes of processes that exited, per (file, GPU).
    retired: BTreeMap<(FileKey, Option<u32>), u64>,
}

impl Ledger {
    fn proc(&mut self, pid: i32) -> &mut Proc {
        let root = self.proc_root.clone();
        let since = self.sample.since_unix_ns;
        let preloaded = self.preloaded.contains(&pid);
        self.procs.entry(pid).or_insert_with(|| Proc {
            row: UploadProcess {
                pid,
                comm: std::fs::read_to_string(root.join(pid.to_string()).join("comm"))
                    .map(|s| s.trim_end().to_string())
                    .unwrap_or_default(),
                traced_from_start: !preloaded,
                traced_since_unix_ns: since,
                ..UploadProcess::default()
            },
            ..Proc::default()
        })
    }

    fn note(&mut self, n: Note) {
        match n {
            Note::Library(l) => {
                if self.sample.since_unix_ns == 0 {
                    self.sample.since_unix_ns = l.attached_unix_ns;
                }
                self.preloaded.extend(l.preloaded_pids.iter().copied());
                for pid in &l.preloaded_pids {
                    if let Some(p) = self.procs.get_mut(pid) {
                        p.row.traced_from_start = false;
                    }
                }
                self.sample.libraries.push(l);
            }
            Note::Mapped { pid, preloaded } => {
                if preloaded {
                    self.preloaded.insert(pid);
                }
                let p = self.proc(pid);
                if preloaded {
                    p.row.traced_from_start = false;
                }
            }
            Note::Lost(n) => self.sample.lost_events += n,
            Note::Record(r) => self.record(r.pid, r.at_unix_ns, r.call),
        }
    }

    fn record(&mut self, pid: i32, at: u64, call: Call) {
        match call {
            Call::Copy(c) => self.copy(pid, at, c),
            Call::Alloc { dst, bytes } => {
                self.proc(pid).allocs.insert(dst, bytes);
            }
            Call::Free { dst } => {
                self.proc(pid).allocs.remove(&dst);
            }
            Call::HostAlloc { addr, bytes } => {
                self.proc(pid).host.insert(addr, bytes);
            }
            Call::HostFree { addr } => {
                self.proc(pid).host.remove(&addr);
            }
            Call::Register { entry, addr, bytes } => {
                if let Some((file, off)) = mapped_file(&self.proc_root, pid, addr, bytes) {
                    self.proc(pid);
                    self.sample.registrations.push(HostRegistration {
                        pid,
                        file,
                        file_offset: off,
                        bytes,
                        at_unix_ns: at,
                        entry: entry_name(entry).into(),
                    });
                }
            }
            Call::Tiny { copies, bytes } => {
                let r = &mut self.proc(pid).row;
                r.copies = r.copies.saturating_add_signed(copies);
                r.copy_bytes = r.copy_bytes.saturating_add_signed(bytes);
                r.unexamined_bytes = r.unexamined_bytes.saturating_add_signed(bytes);
                if copies > 0 {
                    if r.first_copy_unix_ns == 0 {
                        r.first_copy_unix_ns = at;
                    }
                    r.last_copy_unix_ns = r.last_copy_unix_ns.max(at);
                }
            }
            Call::Unregister { .. } | Call::TinySlot { .. } => {}
        }
    }

    fn copy(&mut self, pid: i32, at: u64, c: CopyRecord) {
        let p = self.proc(pid);
        if c.unified
            && p.allocs
                .range(..=c.dst)
                .next_back()
                .is_none_or(|(s, n)| c.dst >= s + n)
        {
            // A unified copy whose destination is no traced device allocation: it may
            // be host to host (or the allocation predates tracing).
            p.row.unexamined_bytes += c.bytes;
            return;
        }
        p.row.copies += 1;
        p.row.copy_bytes += c.bytes;
        if p.row.first_copy_unix_ns == 0 {
            p.row.first_copy_unix_ns = at;
        }
        p.row.last_copy_unix_ns = at;
        if c.anchor.len() < 16 || c.strided {
            p.row.unexamined_bytes += c.bytes;
            return;
        }
        if self.try_match(pid, at, &c) {
            return;
        }
        self.proc(pid).row.other_bytes += c.bytes;
        let size = c.anchor.len() + c.samples.len() * 40;
        if self.pending_bytes + size <= PENDING_BYTES {
            self.pending_bytes += size;
            self.pending.push_back((pid, at, c));
        }
    }

    /// Matches `c` (through its grid points, or as the continuation of the process's last
    /// matched copy) and books it; false when it matched no file.
    fn try_match(&mut self, pid: i32, at: u64, c: &CopyRecord) -> bool {
        let Some(matcher) = self.matcher.as_ref() else {
            return false;
        };
        let follow = self.procs.get(&pid).and_then(|p| p.last);
        let m = matcher.match_copy(c).or_else(|| {
            let f = follow.filter(|f| c.src == f.src_end || c.dst == f.dst_end)?;
            matcher.confirm_at(c, f.file, f.file_end)
        });
        let Some(m) = m else {
            return false;
        };
        let p = self.proc(pid);
        p.row.model_bytes += c.bytes;
        p.last = (!m.widened).then_some(Follow {
            file: m.file,
            file_end: m.end,
            src_end: c.src + c.bytes,
            dst_end: c.dst + c.bytes,
        });
        let u = self
            .uploads
            .entry((pid, m.file, m.widened))
            .or_insert_with(|| FileUpload {
                pid,
                file: m.file,
                widened: m.widened,
                first_unix_ns: at,
                ..FileUpload::default()
            });
        add_range(&mut u.ranges, m.start, m.end);
        u.file_bytes = u.ranges.iter().map(|(a, b)| b - a).sum();
        u.device_bytes += c.bytes;
        u.copies += 1;
        u.first_unix_ns = u.first_unix_ns.min(at);
        u.last_unix_ns = u.last_unix_ns.max(at);
        u.entry = entry_name(c.entry).into();
        true
    }

    /// A new index: copies kept unmatched are matched again.
    fn set_matcher(&mut self, m: Arc<Matcher>) {
        self.matcher = Some(m);
        let pending = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        for (pid, at, c) in pending {
            if self.try_match(pid, at, &c) {
                let p = self.proc(pid);
                p.row.other_bytes = p.row.other_bytes.saturating_sub(c.bytes);
            } else {
                self.pending_bytes += c.anchor.len() + c.samples.len() * 40;
                self.pending.push_back((pid, at, c));
            }
        }
    }

    /// Forgets the processes that exited: their rows, uploads, registrations and copies
    /// kept for a later match (a long recording's ledger holds the living, not every
    /// process since the attach; the model shows only living processes anyway).
    fn forget_exited(&mut self) {
        let gone: BTreeSet<i32> = self
            .procs
            .keys()
            .copied()
            .filter(|p| !self.proc_root.join(p.to_string()).exists())
            .collect();
        if gone.is_empty() {
            return;
        }
        for (k, u) in self.uploads.iter().filter(|(k, _)| gone.contains(&k.0)) {
            let gpu = self.last_gpu.get(&k.0).copied();
            let device_bytes = u.file_bytes * if u.widened { 2 } else { 1 };
            *self.retired.entry((k.1, gpu)).or_default() += device_bytes;
        }
        self.procs.retain(|p, _| !gone.contains(p));
        self.preloaded.retain(|p| !gone.contains(p));
        self.last_gpu.retain(|p, _| !gone.contains(p));
        self.uploads.retain(|k, _| !gone.contains(&k.0));
        self.sample.registrations.retain(|r| !gone.contains(&r.pid));
        self.pending.retain(|(p, _, _)| !gone.contains(p));
        self.pending_bytes = self
            .pending
            .iter()
            .map(|(_, _, c)| c.anchor.len() + c.samples.len() * 40)
            .sum();
    }

    fn snapshot(&self) -> UploadsSample {
        // Once per snapshot: the matcher's reads since the last one leave no page mapped.
        if let Some(m) = &self.matcher {
            m.release();
        }
        let mut s = self.sample.clone();
        s.samples_per_copy = SAMPLES as u32;
        s.processes = self
            .procs
            .values()
            .map(|p| UploadProcess {
                device_alloc_bytes: p.allocs.values().sum(),
                pinned_host_bytes: p.host.values().sum(),
                ..p.row.clone()
            })
            .collect();
        s.uploads = self.uploads.values().cloned().collect();
        s.retired = self
            .retired
            .iter()
            .map(|(&(file, gpu), &device_bytes)| RetiredUpload {
                file,
                gpu,
                device_bytes,
            })
            .collect();
        s
    }
}

/// The model file (and offset in it) a mapping of `pid` backs `[addr, addr + bytes)` with.
fn mapped_file(proc_root: &Path, pid: i32, addr: u64, bytes: u64) -> Option<(FileKey, u64)> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("maps")).ok()?;
    text.lines()
        .filter_map(crate::collect::maps::parse_header)
        .find(|m| m.inode != 0 && m.start <= addr && addr + bytes.max(1) <= m.end)
        .map(|m| (m.key(), m.offset_bytes + (addr - m.start)))
}

/// Upload tracing while the engine traces.
pub(crate) struct Uploads {
    _tracer: UploadTracer,
    ledger: Arc<Mutex<Ledger>>,
    indexed: BTreeSet<FileKey>,
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
            },
            warnings,
        ))
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
            .filter(|f| f.size_bytes.is_some())
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
        for p in &mut s.processes {
            p.gpus = gpu
                .devices
                .iter()
                .filter(|d| d.processes.iter().any(|g| g.pid == p.pid))
                .map(|d| d.info.index)
                .collect();
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(src: u64, dst: u64, bytes: u64) -> CopyRecord {
        CopyRecord {
            entry: 5,
            dst,
            src,
            bytes,
            unified: false,
            strided: false,
            anchor: vec![7; 64],
            samples: Vec::new(),
        }
    }

    #[test]
    fn processes_that_exited_are_forgotten_with_what_they_left() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("10")).unwrap();
        let mut l = Ledger {
            proc_root: root.path().to_path_buf(),
            ..Ledger::default()
        };
        for pid in [10, 11] {
            l.note(Note::Mapped {
                pid,
                preloaded: false,
            });
            l.record(
                pid,
                1,
                Call::Alloc {
                    dst: 0x1000,
                    bytes: 64,
                },
            );
            // No matcher: the copy is kept for a later match.
            l.record(pid, 2, Call::Copy(copy(0x10, 0x1000, 64)));
        }
        let file = FileKey::from_dev(1, 2);
        let up = |file_bytes| FileUpload {
            file_bytes,
            widened: true,
            ..FileUpload::default()
        };
        l.uploads.insert((11, file, true), up(4096));
        l.uploads.insert((10, file, true), up(1024));
        l.last_gpu.insert(11, 3);
        assert_eq!((l.procs.len(), l.pending.len()), (2, 2));
        l.forget_exited();
        // What pid 11 uploaded stays, on the GPU it was last seen on (widened: twice).
        let retired = l.snapshot().retired;
        assert_eq!(
            retired,
            [RetiredUpload {
                file,
                gpu: Some(3),
                device_bytes: 8192
            }]
        );
        l.uploads.clear();
        // pid 11 has no /proc entry: its row, upload and kept copy are gone.
        assert_eq!(l.procs.keys().copied().collect::<Vec<_>>(), [10]);
        assert!(l.uploads.is_empty());
        assert_eq!(l.pending.len(), 1);
        assert_eq!(l.pending_bytes, 64);
        let s = l.snapshot();
        assert_eq!(s.processes.len(), 1);
        assert_eq!(s.processes[0].device_alloc_bytes, 64);
    }

    #[test]
    fn tiny_copies_are_counted_as_not_examined_and_a_copy_sent_later_is_taken_off() {
        let root = tempfile::tempdir().unwrap();
        let mut l = Ledger {
            proc_root: root.path().to_path_buf(),
            ..Ledger::default()
        };
        l.record(
            7,
            1_000,
            Call::Tiny {
                copies: 3,
                bytes: 600,
            },
        );
        // One of them began a chunked upload: it came as a record after all (no matcher
        // here, so not model bytes), and the counters took it off.
        l.record(7, 1_500, Call::Copy(copy(0x10, 0x1000, 200)));
        l.record(
            7,
            2_000,
            Call::Tiny {
                copies: -1,
                bytes: -200,
            },
        );
        let r = &l.snapshot().processes[0];
        assert_eq!((r.copies, r.copy_bytes), (3, 600));
        assert_eq!(
            (r.unexamined_bytes, r.other_bytes, r.model_bytes),
            (400, 200, 0)
        );
        assert_eq!((r.first_copy_unix_ns, r.last_copy_unix_ns), (1_000, 1_500));
    }
}

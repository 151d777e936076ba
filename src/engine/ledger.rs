//! The upload ledger: the [`UploadTracer`](crate::collect::bpf::uploads::UploadTracer)'s
//! records, matched as they come against the model files' grid ([`Matcher`]) and kept per
//! process and file, with the device ranges that hold matched model bytes (the sources a
//! device-to-device copy clones, [`super::held`]).
//!
//! Copies that matched no file are kept (at most [`PENDING_BYTES`] of samples) and
//! matched again when collection finds new model files: a loader may upload before its
//! file is known to be a model file.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::held::{Held, HeldMap};
use crate::collect::bpf::uploads::{entry_name, Call, CopyRecord, Note, SAMPLES};
use crate::dupes::index::CopyKind;
use crate::dupes::uploads::{add_range, Matched, Matcher};
use crate::sample::converted::Conversion;
use crate::sample::uploads::{
    DeviceClone, FileUpload, GdsTrace, HostRegistration, RetiredUpload, UploadProcess,
    UploadsSample,
};
use crate::sample::FileKey;

/// Why GPUDirect Storage reads are not traced, when no libcufile was found.
pub const NO_CUFILE: &str = "no libcufile (GPUDirect Storage) installed or loaded by a process yet; a process that loads one later is traced";

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
pub(super) struct Proc {
    pub(super) row: UploadProcess,
    last: Vec<Follow>,
    /// Live device allocations: start → bytes.
    pub(super) allocs: BTreeMap<u64, u64>,
    pub(super) host: BTreeMap<u64, u64>,
    /// Device ranges holding matched model bytes.
    pub(super) held: HeldMap,
    /// The files it held open or mapped when last looked at, and when.
    related: Option<(Instant, BTreeSet<FileKey>)>,
    /// Its GPUDirect Storage handles (`cuFileHandleRegister`) and their files.
    gds: BTreeMap<u64, FileKey>,
}

#[derive(Default)]
pub(super) struct Ledger {
    pub(super) matcher: Option<Arc<Matcher>>,
    pub(super) proc_root: PathBuf,
    pub(super) sample: UploadsSample,
    pub(super) procs: BTreeMap<i32, Proc>,
    pub(super) uploads: BTreeMap<(i32, FileKey, Option<Conversion>), FileUpload>,
    pub(super) pending: VecDeque<(i32, u64, CopyRecord)>,
    pub(super) pending_bytes: usize,
    /// Processes that mapped an attached library since before it was attached.
    pub(super) preloaded: BTreeSet<i32>,
    /// The one GPU each process was last seen holding memory on (NVML).
    pub(super) last_gpu: BTreeMap<i32, u32>,
    /// Device bytes of processes that exited, per (file, GPU).
    pub(super) retired: BTreeMap<(FileKey, Option<u32>), u64>,
    /// Something changed since the ledger was last published.
    pub(super) changed: bool,
}

/// Which of `want` `pid` holds open or maps now. Its `maps` name each mapping's file; an
/// fd is looked at only when its `fdinfo` inode is one of `want`'s (then `stat`ed through
/// its link under the collection's deadline: a filesystem that does not answer never holds
/// the upload tracer up).
fn held_files(proc_root: &Path, pid: i32, want: &BTreeSet<FileKey>) -> BTreeSet<FileKey> {
    use std::os::unix::fs::MetadataExt;
    let dir = proc_root.join(pid.to_string());
    let mut out = BTreeSet::new();
    if let Ok(text) = std::fs::read_to_string(dir.join("maps")) {
        out.extend(
            text.lines()
                .filter_map(crate::collect::maps::parse_header)
                .map(|m| m.key())
                .filter(|k| want.contains(k)),
        );
    }
    let Ok(fds) = std::fs::read_dir(dir.join("fdinfo")) else {
        return out;
    };
    for fd in fds.flatten().take(65_536) {
        let info = std::fs::read_to_string(fd.path()).unwrap_or_default();
        let ino: Option<u64> = info
            .lines()
            .find_map(|l| l.strip_prefix("ino:"))
            .and_then(|v| v.trim().parse().ok());
        // Without an inode in fdinfo (kernels before 5.14), every fd is looked at.
        let Some(key) = want.iter().find(|k| ino.is_none_or(|i| i == k.inode)) else {
            continue;
        };
        let link = dir.join("fd").join(fd.file_name());
        let place = crate::collect::answer::Place::of_key(*key);
        if let Ok(Ok(m)) = crate::collect::answer::metadata(place, &link) {
            let k = FileKey::from_dev(m.dev(), m.ino());
            if want.contains(&k) {
                out.insert(k);
            }
        }
    }
    out
}

fn pending_size(c: &CopyRecord) -> usize {
    c.anchor.len() + c.samples.len() * 40
}

impl Ledger {
    pub(super) fn proc(&mut self, pid: i32) -> &mut Proc {
        let root = self.proc_root.clone();
        let since = self.sample.since_unix_ns;
        let preloaded = self.preloaded.contains(&pid);
        self.changed = true;
        self.procs.entry(pid).or_insert_with(|| Proc {
            row: UploadProcess {
                pid,
                comm: std::fs::read_to_string(root.join(pid.to_string()).join("comm"))
                    .map(|s| s.trim_end().to_string())
                    .unwrap_or_default(),
                traced_from_start: !preloaded,
                traced_since_unix_ns: since,
                start_ticks: crate::collect::process::start_time(&root, pid),
                ..UploadProcess::default()
            },
            ..Proc::default()
        })
    }

    pub(super) fn note(&mut self, n: Note) {
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
                self.changed = true;
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
            Note::Lost(n) => {
                self.sample.lost_events += n;
                self.changed = true;
            }
            Note::Record(r) => self.record(r.pid, r.at_unix_ns, r.call),
        }
    }

    pub(super) fn record(&mut self, pid: i32, at: u64, call: Call) {
        match call {
            Call::Copy(c) => self.copy(pid, at, c),
            Call::DeviceCopy {
                entry,
                dst,
                src,
                bytes,
            } => {
                let p = self.proc(pid);
                p.row.device_copies += 1;
                p.row.device_copy_bytes += bytes;
                p.held.clone_range(src, dst, bytes, entry, at);
            }
            Call::Alloc { dst, bytes } => {
                let p = self.proc(pid);
                // A new allocation holds nothing yet (a range freed without a traced free).
                p.held.cut(dst, dst.saturating_add(bytes));
                p.allocs.insert(dst, bytes);
            }
            Call::Free { dst } => {
                let p = self.proc(pid);
                let end = p.allocs.remove(&dst).map(|n| dst.saturating_add(n));
                p.held.free(dst, end);
            }
            Call::HostAlloc { addr, bytes } => {
                self.proc(pid).host.insert(addr, bytes);
            }
            Call::HostFree { addr } => {
                self.proc(pid).host.remove(&addr);
            }
            Call::Register { entry, addr, bytes } => {
                if let Some((file, off)) =
                    crate::collect::maps::mapped_file(&self.proc_root, pid, addr, bytes)
                {
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
            Call::GdsHandle { handle, file } => {
                self.proc(pid).gds.insert(handle, file);
            }
            Call::GdsRead {
                entry,
                handle,
                dst,
                bytes,
                file_offset,
            } => self.gds_read(pid, at, entry, handle, dst, bytes, file_offset),
            Call::Unregister { .. } | Call::TinySlot { .. } => {}
        }
    }

    /// `cuFileRead`: the file's bytes at `file_offset` DMA'd into device memory at `dst`
    /// (GPUDirect Storage: no host copy, no `cuMemcpyHtoD`). Proven by the read itself:
    /// the handle names the file; nothing to sample.
    #[allow(clippy::too_many_arguments)]
    fn gds_read(
        &mut self,
        pid: i32,
        at: u64,
        entry: u32,
        handle: u64,
        dst: u64,
        bytes: u64,
        file_offset: u64,
    ) {
        let indexed = self.sample.indexed.clone();
        let p = self.proc(pid);
        p.row.copies += 1;
        p.row.copy_bytes += bytes;
        if p.row.first_copy_unix_ns == 0 {
            p.row.first_copy_unix_ns = at;
        }
        p.row.last_copy_unix_ns = at;
        let Some(file) = p.gds.get(&handle).copied() else {
            // Registered before tracing: which file is not known.
            p.row.unexamined_bytes += bytes;
            return;
        };
        // A model file's bytes (else a data set's, say).
        if indexed.contains(&file) {
            p.row.model_bytes += bytes;
        } else {
            p.row.other_bytes += bytes;
        }
        p.held.insert(
            dst,
            Held {
                len: bytes,
                files: vec![(file, file_offset)],
                elements: (1, 1),
                conversion: None,
                clone: None,
            },
        );
        let m = Matched {
            file,
            kind: CopyKind::Identical,
            start: file_offset,
            end: file_offset + bytes,
        };
        self.book(pid, at, (bytes, entry), &m, &[], false);
    }

    fn copy(&mut self, pid: i32, at: u64, c: CopyRecord) {
        let p = self.proc(pid);
        let in_alloc = |dst: u64| {
            p.allocs
                .range(..=dst)
                .next_back()
                .is_some_and(|(s, n)| dst < s + n)
        };
        if c.unified && p.held.overlaps(c.src, c.bytes) {
            // From device memory that holds model bytes: a copy on the device when its
            // destination is device memory too (else it goes back to the host).
            if in_alloc(c.dst) {
                p.row.device_copies += 1;
                p.row.device_copy_bytes += c.bytes;
                p.held.clone_range(c.src, c.dst, c.bytes, c.entry, at);
            }
            return;
        }
        if c.unified && !in_alloc(c.dst) {
            // A unified copy whose destination is no traced device allocation: it may
            // be host to host (or the allocation predates tracing).
            p.row.unexamined_bytes += c.bytes;
            return;
        }
        // What the destination held is overwritten.
        p.held.cut(c.dst, c.dst.saturating_add(c.bytes));
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
        let size = pending_size(&c);
        if self.pending_bytes + size <= PENDING_BYTES {
            self.pending_bytes += size;
            self.pending.push_back((pid, at, c));
        }
    }

    /// Which of the indexed files `pid` holds open or maps, looked at most once a second.
    fn related(&mut self, pid: i32) -> BTreeSet<FileKey> {
        let root = self.proc_root.clone();
        let want: BTreeSet<FileKey> = self.sample.indexed.iter().copied().collect();
        let p = self.proc(pid);
        match &p.related {
            Some((when, set)) if when.elapsed() < Duration::from_secs(1) => set.clone(),
            _ => {
                let set = held_files(&root, pid, &want);
                p.related = Some((Instant::now(), set.clone()));
                set
            }
        }
    }

    /// Matches `c` (through its grid points, or as the continuation of the process's last
    /// matched copy) and books it under every file it matched; false when it matched none.
    pub(super) fn try_match(&mut self, pid: i32, at: u64, c: &CopyRecord) -> bool {
        let Some(matcher) = self.matcher.clone() else {
            return false;
        };
        let mut found = matcher.match_all(c);
        if found.is_empty() {
            let follows = self
                .procs
                .get(&pid)
                .map(|p| p.last.clone())
                .unwrap_or_default();
            found = follows
                .iter()
                .filter(|f| c.src == f.src_end || c.dst == f.dst_end)
                .filter_map(|f| matcher.confirm_at(c, f.file, f.file_end))
                .collect();
        }
        if found.is_empty() {
            return false;
        }
        // One form: the first file's (the others are kept only where they agree).
        let kind = found[0].kind;
        found.retain(|m| m.kind == kind);
        let related = if found.len() > 1 {
            self.related(pid)
        } else {
            BTreeSet::new()
        };
        let (fe, me) = kind.elements();
        let p = self.proc(pid);
        p.row.model_bytes += c.bytes;
        p.last = found
            .iter()
            .filter(|m| m.kind == CopyKind::Identical)
            .map(|m| Follow {
                file: m.file,
                file_end: m.end,
                src_end: c.src + c.bytes,
                dst_end: c.dst + c.bytes,
            })
            .collect();
        p.held.insert(
            c.dst,
            Held {
                len: c.bytes,
                files: found.iter().map(|m| (m.file, m.start)).collect(),
                elements: (fe, me),
                conversion: kind.conversion(),
                clone: None,
            },
        );
        for m in &found {
            let also: Vec<FileKey> = found
                .iter()
                .map(|o| o.file)
                .filter(|f| *f != m.file)
                .collect();
            self.book(
                pid,
                at,
                (c.bytes, c.entry),
                m,
                &also,
                related.contains(&m.file),
            );
        }
        true
    }

    /// Books `bytes` of a copy through `entry` (matched as `m`) under `m`'s file.
    fn book(
        &mut self,
        pid: i32,
        at: u64,
        (bytes, entry): (u64, u32),
        m: &Matched,
        also: &[FileKey],
        held: bool,
    ) {
        let conversion = m.conversion();
        let u = self
            .uploads
            .entry((pid, m.file, conversion))
            .or_insert_with(|| FileUpload {
                pid,
                file: m.file,
                widened: matches!(
                    conversion,
                    Some(Conversion::F16ToF32 | Conversion::Bf16ToF32)
                ),
                conversion,
                first_unix_ns: at,
                ..FileUpload::default()
            });
        add_range(&mut u.ranges, m.start, m.end);
        u.file_bytes = u.ranges.iter().map(|(a, b)| b - a).sum();
        u.device_bytes += bytes;
        u.copies += 1;
        u.first_unix_ns = u.first_unix_ns.min(at);
        u.last_unix_ns = u.last_unix_ns.max(at);
        u.entry = entry_name(entry).into();
        for f in also {
            if !u.also.contains(f) {
                u.also.push(*f);
                u.also.sort();
            }
        }
        u.held_at_upload |= held;
    }

    /// A new index: copies kept unmatched are matched again.
    pub(super) fn set_matcher(&mut self, m: Arc<Matcher>) {
        self.sample.indexed = m.keys().to_vec();
        self.sample.indexed.sort();
        self.matcher = Some(m);
        self.changed = true;
        let pending = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        for (pid, at, c) in pending {
            if self.try_match(pid, at, &c) {
                let p = self.proc(pid);
                p.row.other_bytes = p.row.other_bytes.saturating_sub(c.bytes);
            } else {
                self.pending_bytes += pending_size(&c);
                self.pending.push_back((pid, at, c));
            }
        }
    }

    /// Forgets the processes that exited: their rows, uploads, registrations and copies
    /// kept for a later match (a long recording's ledger holds the living, not every
    /// process since the attach; the model shows only living processes anyway).
    pub(super) fn forget_exited(&mut self) {
        let gone: BTreeSet<i32> = self
            .procs
            .iter()
            .filter(|(pid, p)| {
                // Gone, or its pid is another process's now (another start time).
                !self.proc_root.join(pid.to_string()).exists()
                    || matches!(
                        (p.row.start_ticks, crate::collect::process::start_time(&self.proc_root, **pid)),
                        (Some(a), Some(b)) if a != b
                    )
            })
            .map(|(pid, _)| *pid)
            .collect();
        if gone.is_empty() {
            return;
        }
        self.changed = true;
        for (k, u) in self.uploads.iter().filter(|(k, _)| gone.contains(&k.0)) {
            let gpu = self.last_gpu.get(&k.0).copied();
            let kind = k.2.map_or(CopyKind::Identical, CopyKind::from);
            *self.retired.entry((k.1, gpu)).or_default() += kind.mem_bytes(u.file_bytes);
        }
        self.procs.retain(|p, _| !gone.contains(p));
        self.preloaded.retain(|p| !gone.contains(p));
        self.last_gpu.retain(|p, _| !gone.contains(p));
        self.uploads.retain(|k, _| !gone.contains(&k.0));
        self.sample.registrations.retain(|r| !gone.contains(&r.pid));
        self.pending.retain(|(p, _, _)| !gone.contains(p));
        self.pending_bytes = self.pending.iter().map(|(_, _, c)| pending_size(c)).sum();
    }

    pub(super) fn snapshot(&self) -> UploadsSample {
        // Once per snapshot: the matcher's reads since the last one leave no page mapped.
        if let Some(m) = &self.matcher {
            m.release();
        }
        let mut s = self.sample.clone();
        if !s.libraries.is_empty() {
            s.unavailable = None;
        }
        let cufile: Vec<String> = s
            .libraries
            .iter()
            .filter(|l| crate::collect::bpf::uploads::is_cufile(&l.path))
            .map(|l| l.path.clone())
            .collect();
        s.gds = Some(GdsTrace {
            unavailable: cufile.is_empty().then(|| NO_CUFILE.to_string()),
            libraries: cufile,
        });
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
        // What each upload still holds: overwritten and freed ranges are no copy now.
        let held: BTreeMap<i32, _> = self
            .procs
            .iter()
            .map(|(k, p)| (*k, p.held.uploaded()))
            .collect();
        s.uploads = self
            .uploads
            .values()
            .map(|u| {
                let h = held
                    .get(&u.pid)
                    .and_then(|h| h.get(&(u.file, u.conversion)));
                FileUpload {
                    held_ranges: Some(h.cloned().unwrap_or_default()),
                    ..u.clone()
                }
            })
            .collect();
        s.clones = self
            .procs
            .iter()
            .flat_map(|(pid, p)| p.held.clones(*pid))
            .collect::<Vec<DeviceClone>>();
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

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;

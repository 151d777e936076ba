//! The upload tracer: uprobes on the CUDA driver library and on GPUDirect Storage's
//! libcufile (`ebpf/uploads.bpf.c`).
//!
//! The libraries are found as [`super::libraries`] says; a uprobe is set on the file, so every process that maps it, now or later, is traced. A
//! thread drains the ring buffer as records come (a loader uploads gigabytes in seconds),
//! hands each record to the caller's sink, and looks for new library files every second.
//! Dropping the tracer stops the thread and detaches every probe.

use std::collections::BTreeSet;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use aya::maps::{Array, MapData, RingBuf};
use aya::programs::uprobe::{UProbeAttachPoint, UProbeScope};
use aya::programs::UProbe;
use aya::{Ebpf, EbpfLoader};

use super::setup::{ensure_tracefs, monotonic_ns, raise_memlock};
use super::tiny::TinySlots;
use super::{check_privilege, TraceError};
use crate::sample::uploads::TracedLibrary;
use crate::sample::FileKey;

pub use super::libraries::is_cufile;
use super::libraries::{configured_libraries, mapped_libraries};
pub use super::upload_entries::{attach_floor, entry_name, Entry, ENTRIES};
pub use super::upload_records::*;

fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64
}

/// The loaded object and what is attached.
struct Probes {
    ebpf: Ebpf,
    /// Library files attached (or that failed to attach: not tried again).
    libraries: BTreeSet<FileKey>,
    /// Processes seen mapping an attached library.
    seen: BTreeSet<i32>,
}

impl Probes {
    /// Attaches every known entry point of the library at `path`; how many.
    fn attach_library(&mut self, path: &Path) -> Result<u32, String> {
        let mut n = 0;
        let mut errors = Vec::new();
        for entry in ENTRIES {
            let mut one = |prog: &str| -> Result<(), String> {
                let p: &mut UProbe = self
                    .ebpf
                    .program_mut(prog)
                    .ok_or_else(|| format!("program '{prog}' is not in the object"))?
                    .try_into()
                    .map_err(|e| format!("{e}"))?;
                p.attach(
                    UProbeAttachPoint {
                        location: entry.symbol.into(),
                        cookie: Some(u64::from(entry.id)),
                    },
                    path,
                    UProbeScope::AllProcesses,
                )
                .map(|_| ())
                .map_err(|e| super::chain(&e))
            };
            match one(entry.program).and_then(|()| entry.ret.map_or(Ok(()), &mut one)) {
                Ok(()) => n += 1,
                Err(e) => errors.push(format!("{}: {e}", entry.symbol)),
            }
        }
        if n == 0 {
            return Err(errors.first().cloned().unwrap_or_default());
        }
        Ok(n)
    }

    /// Attaches library files not attached yet and tells the sink who maps them.
    fn discover(
        &mut self,
        proc_root: &Path,
        sink: &mut dyn FnMut(Note),
        first: bool,
    ) -> Vec<String> {
        let mut warnings = Vec::new();
        let mapped = mapped_libraries(proc_root);
        // Processes that no longer map a library are forgotten (memory stays bounded; a
        // pid used again is a new process, seen anew).
        self.seen
            .retain(|p| mapped.values().any(|(_, _, pids)| pids.contains(p)));
        let mut files: Vec<(FileKey, PathBuf, String, BTreeSet<i32>)> = mapped
            .into_iter()
            .map(|(k, (p, shown, pids))| (k, p, shown, pids))
            .collect();
        if first {
            for p in configured_libraries() {
                if let Ok(m) = std::fs::metadata(&p) {
                    let k = FileKey::from_dev(m.dev(), m.ino());
                    if !files.iter().any(|f| f.0 == k) {
                        let shown = p.display().to_string();
                        files.push((k, p, shown, BTreeSet::new()));
                    }
                }
            }
        }
        for (key, path, shown, pids) in files {
            if self.libraries.insert(key) {
                let attached_unix_ns = unix_now_ns();
                match self.attach_library(&path) {
                    Ok(n) => sink(Note::Library(TracedLibrary {
                        // As the processes that map it see it (not /proc/PID/root/...).
                        path: shown,
                        attached_unix_ns,
                        entry_points: n,
                        preloaded_pids: pids.iter().copied().collect(),
                    })),
                    Err(e) => warnings.push(format!(
                        "cannot trace uploads through '{}': {e}",
                        path.display()
                    )),
                }
                for pid in &pids {
                    self.seen.insert(*pid);
                    sink(Note::Mapped {
                        pid: *pid,
                        preloaded: true,
                    });
                }
            } else {
                for pid in pids {
                    if self.seen.insert(pid) {
                        sink(Note::Mapped {
                            pid,
                            preloaded: false,
                        });
                    }
                }
            }
        }
        warnings
    }
}

/// Attached upload probes and the thread that drains them; detached when dropped.
pub struct UploadTracer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    warnings: Vec<String>,
    libraries: usize,
}

impl UploadTracer {
    /// Loads `uploads.bpf.o` (from `objects_dir` when given), attaches the driver
    /// libraries found now, and starts the thread that hands every record to `sink`.
    pub fn attach(
        objects_dir: Option<&Path>,
        proc_root: &Path,
        mut sink: Box<dyn FnMut(Note) + Send>,
    ) -> Result<UploadTracer, TraceError> {
        check_privilege(proc_root)?;
        raise_memlock();
        ensure_tracefs()?;
        let mut loader = EbpfLoader::new();
        let loaded = match objects_dir {
            Some(d) => loader.load_file(d.join("uploads.bpf.o")),
            None => loader.load(aya::include_bytes_aligned!("../../../ebpf/uploads.bpf.o")),
        };
        let mut ebpf = loaded.map_err(|source| TraceError::Load {
            object: "uploads.bpf.o".into(),
            source: Box::new(source),
        })?;
        let mut programs: BTreeSet<&str> = ENTRIES.iter().map(|e| e.program).collect();
        programs.extend(ENTRIES.iter().filter_map(|e| e.ret));
        for prog in programs {
            let p: &mut UProbe = ebpf
                .program_mut(prog)
                .and_then(|p| p.try_into().ok())
                .ok_or(TraceError::NothingAttached(format!(
                    "no program '{prog}' in uploads.bpf.o"
                )))?;
            p.load().map_err(|e| {
                TraceError::NothingAttached(format!(
                    "the verifier rejected '{prog}': {}",
                    super::chain(&e)
                ))
            })?;
        }
        let ring = ebpf.take_map("uploads").ok_or(TraceError::Map {
            object: "uploads",
            map: "uploads",
            source: None,
        })?;
        let ring = RingBuf::try_from(ring).map_err(|e| TraceError::Map {
            object: "uploads",
            map: "uploads",
            source: Some(e),
        })?;
        let mut probes = Probes {
            ebpf,
            libraries: BTreeSet::new(),
            seen: BTreeSet::new(),
        };
        let warnings = probes.discover(proc_root, &mut *sink, true);
        let libraries = probes.libraries.len();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let proc_root = proc_root.to_path_buf();
        let mono_to_unix = unix_now_ns() as i128 - monotonic_ns() as i128;
        let thread = std::thread::Builder::new()
            .name("twofold-uploads".into())
            .spawn(move || drain(probes, ring, &proc_root, &stop2, mono_to_unix, sink))
            .map_err(|e| {
                TraceError::NothingAttached(format!("cannot start the upload reader: {e}"))
            })?;
        Ok(UploadTracer {
            stop,
            thread: Some(thread),
            warnings,
            libraries,
        })
    }

    /// Library files attached when it started.
    pub fn libraries(&self) -> usize {
        self.libraries
    }

    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

impl Drop for UploadTracer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The reader thread: drains the ring buffer (waking on data, at least every 50 ms) and
/// looks for new library files every second, until `stop`.
fn drain(
    mut probes: Probes,
    mut ring: RingBuf<MapData>,
    proc_root: &Path,
    stop: &AtomicBool,
    mono_to_unix: i128,
    mut sink: Box<dyn FnMut(Note) + Send>,
) {
    let fd = ring.as_raw_fd();
    let mut last_scan = Instant::now();
    let mut lost_seen = 0u64;
    let mut tiny = TinySlots::default();
    loop {
        while let Some(item) = ring.next() {
            if let Some(r) = parse(&item, mono_to_unix) {
                hand_on(r, &mut tiny, &mut *sink);
            }
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if last_scan.elapsed() >= Duration::from_secs(1) {
            let _ = probes.discover(proc_root, &mut *sink, false);
            let lost = lost_records(&probes.ebpf);
            if lost > lost_seen {
                sink(Note::Lost(lost - lost_seen));
                lost_seen = lost;
                tiny.find_all(&probes.ebpf);
            }
            tiny_counts(&mut tiny, &mut probes.ebpf, proc_root, &mut *sink);
            last_scan = Instant::now();
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one pollfd we own, for at most 50 ms.
        unsafe {
            libc::poll(&mut pfd, 1, 50);
        }
    }
    // Records sent before the stop are still handed over, and the last counts.
    while let Some(item) = ring.next() {
        if let Some(r) = parse(&item, mono_to_unix) {
            hand_on(r, &mut tiny, &mut *sink);
        }
    }
    let lost = lost_records(&probes.ebpf);
    if lost > lost_seen {
        sink(Note::Lost(lost - lost_seen));
        tiny.find_all(&probes.ebpf);
    }
    tiny_counts(&mut tiny, &mut probes.ebpf, proc_root, &mut *sink);
}

/// Hands a record on to the sink; a slot taken is the tracer's own business.
pub(super) fn hand_on(r: Record, tiny: &mut TinySlots, sink: &mut dyn FnMut(Note)) {
    match r.call {
        Call::TinySlot { slot } => tiny.took(slot, r.pid),
        _ => sink(Note::Record(r)),
    }
}

/// Hands on what each process's tiny copies added since the last read, as of now.
fn tiny_counts(
    tiny: &mut TinySlots,
    ebpf: &mut Ebpf,
    proc_root: &Path,
    sink: &mut dyn FnMut(Note),
) {
    let at_unix_ns = unix_now_ns();
    for d in tiny.read(ebpf, proc_root) {
        sink(Note::Record(Record {
            pid: d.pid,
            at_unix_ns,
            call: Call::Tiny {
                copies: d.copies,
                bytes: d.bytes,
            },
        }));
    }
}

/// Records the ring buffer had no room for (`totals[TOTAL_MAP_FULL]`).
fn lost_records(ebpf: &Ebpf) -> u64 {
    ebpf.map("totals")
        .and_then(|m| Array::<_, u64>::try_from(m).ok())
        .and_then(|a| a.get(&super::layout::TOTAL_MAP_FULL, 0).ok())
        .unwrap_or(0)
}

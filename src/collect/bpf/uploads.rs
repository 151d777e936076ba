//! The upload tracer: uprobes on the CUDA driver library (`ebpf/uploads.bpf.c`).
//!
//! The library is found in the maps of the processes that load it (any file named
//! `libcuda.so*`), in `/etc/ld.so.cache`, and in `TWOFOLD_LIBCUDA` (`:`-separated paths);
//! a uprobe is set on the file, so every process that maps it, now or later, is traced. A
//! thread drains the ring buffer as records come (a loader uploads gigabytes in seconds),
//! hands each record to the caller's sink, and looks for new library files every second.
//! Dropping the tracer stops the thread and detaches every probe.

use std::collections::{BTreeMap, BTreeSet};
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

pub use super::upload_entries::{attach_floor, entry_name, Entry, ENTRIES};

/// Layout constants of `ebpf/twofold.h` (`UP_*`).
pub const ANCHOR: usize = 2064;
pub const SAMPLES: usize = 16;
pub const SAMPLE: usize = 32;
/// Copies of at most this many bytes come whole in a small record (`UP_SMALL`).
pub const SMALL: usize = 256;
const HEAD: usize = 56;
const COPY: usize = HEAD + 8 + ANCHOR + SAMPLES * SAMPLE;
const SMALL_COPY: usize = HEAD + 8 + SMALL;
/// `UPF_SMALL`: a `struct upload_small` record.
const FLAG_SMALL: u32 = 4;

/// Offset of content sample `i` in a copy of `len` contiguous bytes (`len >= 32`).
pub fn sample_offset(len: u64, i: usize) -> u64 {
    (len - SAMPLE as u64) * i as u64 / (SAMPLES as u64 - 1)
}

/// One host-to-device copy as the probe saw it.
#[derive(Debug, Clone)]
pub struct CopyRecord {
    pub entry: u32,
    pub dst: u64,
    pub src: u64,
    pub bytes: u64,
    /// The destination is device memory only if it lies in a traced device allocation.
    pub unified: bool,
    /// Rows not contiguous: only the first row was sampled.
    pub strided: bool,
    /// The first bytes of the source (empty: not present, or not readable).
    pub anchor: Vec<u8>,
    /// `(offset, bytes)` of each sample that was read.
    pub samples: Vec<(u64, [u8; SAMPLE])>,
}

/// What a record says.
#[derive(Debug, Clone)]
pub enum Call {
    Copy(CopyRecord),
    Register {
        entry: u32,
        addr: u64,
        bytes: u64,
    },
    Unregister {
        addr: u64,
    },
    Alloc {
        dst: u64,
        bytes: u64,
    },
    Free {
        dst: u64,
    },
    HostAlloc {
        addr: u64,
        bytes: u64,
    },
    HostFree {
        addr: u64,
    },
    /// Tiny copies (at most [`SMALL`] bytes each) counted since the last such record:
    /// their number and bytes, signed (see [`super::tiny`]). No content: not examined.
    Tiny {
        copies: i64,
        bytes: i64,
    },
    /// The process took a slot of the tiny-copy counters (read by the tracer itself).
    TinySlot {
        slot: u32,
    },
    /// A device-to-device copy (`cuMemcpyDtoD*`, `cuMemcpyPeer*`): no content (device
    /// memory cannot be read from the host).
    DeviceCopy {
        entry: u32,
        dst: u64,
        src: u64,
        bytes: u64,
    },
}

/// One record: who, when (wall clock) and what.
#[derive(Debug, Clone)]
pub struct Record {
    pub pid: i32,
    pub at_unix_ns: u64,
    pub call: Call,
}

/// What the tracer tells its sink.
#[derive(Debug, Clone)]
pub enum Note {
    Record(Record),
    /// A library file was attached.
    Library(TracedLibrary),
    /// A process maps an attached library (`preloaded`: since before it was attached).
    Mapped {
        pid: i32,
        preloaded: bool,
    },
    /// Records lost since the last note (the ring buffer was full).
    Lost(u64),
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or([0; 4]))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]))
}

/// Parses one ring-buffer record (`struct upload_head`, or `struct upload_copy`).
pub fn parse(b: &[u8], mono_to_unix: i128) -> Option<Record> {
    if b.len() < HEAD {
        return None;
    }
    let at = (u64_at(b, 0) as i128 + mono_to_unix).max(0) as u64;
    let pid = u32_at(b, 8) as i32;
    let entry = u32_at(b, 16);
    let kind = u32_at(b, 20);
    let (dst, src, bytes, flags) = (u64_at(b, 24), u64_at(b, 32), u64_at(b, 40), u32_at(b, 48));
    let call = match kind {
        1 => {
            let small = flags & FLAG_SMALL != 0;
            if b.len() < if small { SMALL_COPY } else { COPY } {
                return None;
            }
            let anchor_len = (u32_at(b, HEAD) as usize).min(if small { SMALL } else { ANCHOR });
            let sampled = u32_at(b, HEAD + 4);
            let strided = flags & 2 != 0;
            let first = if strided { 0 } else { bytes };
            let samples = (0..SAMPLES)
                .filter(|i| !small && sampled & (1 << i) != 0 && first >= SAMPLE as u64)
                .map(|i| {
                    let o = HEAD + 8 + ANCHOR + i * SAMPLE;
                    let mut w = [0u8; SAMPLE];
                    w.copy_from_slice(&b[o..o + SAMPLE]);
                    (sample_offset(first, i), w)
                })
                .collect();
            Call::Copy(CopyRecord {
                entry,
                dst,
                src,
                bytes,
                unified: flags & 1 != 0,
                strided,
                anchor: b[HEAD + 8..HEAD + 8 + anchor_len].to_vec(),
                samples,
            })
        }
        2 => Call::Register {
            entry,
            addr: src,
            bytes,
        },
        3 => Call::Unregister { addr: src },
        4 => Call::Alloc { dst, bytes },
        5 => Call::Free { dst },
        6 => Call::HostAlloc { addr: src, bytes },
        7 => Call::HostFree { addr: src },
        8 => Call::TinySlot { slot: dst as u32 },
        9 => Call::DeviceCopy {
            entry,
            dst,
            src,
            bytes,
        },
        _ => return None,
    };
    Some(Record {
        pid,
        at_unix_ns: at,
        call,
    })
}

/// Whether a mapped path names the CUDA driver library.
fn is_libcuda(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|b| b.starts_with("libcuda.so"))
}

/// Where drivers install the library (the container toolkit's mount included).
const KNOWN: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "/usr/local/nvidia/lib/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
];

/// Paths of the driver library `TWOFOLD_LIBCUDA` and `/etc/ld.so.cache` name, and the
/// usual install paths.
fn configured_libraries() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = KNOWN
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .collect();
    if let Some(v) = std::env::var_os("TWOFOLD_LIBCUDA") {
        out.extend(std::env::split_paths(&v).filter(|p| p.is_file()));
    }
    if let Ok(cache) =
        crate::input::read_bounded(Path::new("/etc/ld.so.cache"), "ld.so.cache", 16 << 20)
    {
        for s in cache.split(|b| *b == 0) {
            if let Ok(s) = std::str::from_utf8(s) {
                if s.starts_with('/') && is_libcuda(s) && Path::new(s).is_file() {
                    out.push(PathBuf::from(s));
                }
            }
        }
    }
    out
}

/// A library file mapped by processes: the path to attach through (in the first mapper's
/// root), the path as that process sees it, and who maps it.
type MappedLibrary = (PathBuf, String, BTreeSet<i32>);

/// Library files mapped by each process.
fn mapped_libraries(proc_root: &Path) -> BTreeMap<FileKey, MappedLibrary> {
    let mut out: BTreeMap<FileKey, MappedLibrary> = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return out;
    };
    for d in dir.flatten() {
        let Some(pid) = d.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(d.path().join("maps")) else {
            continue;
        };
        for line in text.lines().filter(|l| l.contains("libcuda.so")) {
            let Some(m) = crate::collect::maps::parse_header(line) else {
                continue;
            };
            if m.inode == 0 || !is_libcuda(&m.path) {
                continue;
            }
            let via = d.path().join("root").join(m.path.trim_start_matches('/'));
            out.entry(m.key())
                .or_insert_with(|| (via, m.path.clone(), BTreeSet::new()))
                .2
                .insert(pid);
        }
    }
    out
}

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
            match one(entry.program)
                .and_then(|()| if entry.ret { one("ret_alloc") } else { Ok(()) })
            {
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
        programs.insert("ret_alloc");
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
fn hand_on(r: Record, tiny: &mut TinySlots, sink: &mut dyn FnMut(Note)) {
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

#[cfg(test)]
#[path = "uploads_tests.rs"]
mod tests;

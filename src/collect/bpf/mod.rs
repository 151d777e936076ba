//! Loading and attaching twofold's eBPF programs (`ebpf/*.bpf.c`, compiled objects
//! committed as `ebpf/*.bpf.o` and embedded in the binary), and reading their maps into a
//! [`TraceSample`].
//!
//! Everything BPF happens in this module. Each step carries a context message; a
//! tracepoint the kernel lacks disables only the counter it feeds (listed in
//! [`TraceSample::unavailable`]), never the whole trace. Without root or `CAP_BPF` +
//! `CAP_PERFMON`, [`Tracer::attach`] fails with [`TraceError::Privilege`] before touching
//! anything, and callers keep working without the counters.
//!
//! Kernel interfaces: tracepoints under `/sys/kernel/tracing/events` (mounted here if
//! missing), BTF at `/sys/kernel/btf/vmlinux` for CO-RE relocations; see
//! <https://docs.kernel.org/trace/events.html> and <https://docs.kernel.org/bpf/>.

pub mod layout;
mod libraries;
mod read;
mod setup;
pub mod tasks;
mod tiny;
mod upload_entries;
mod upload_records;
pub mod uploads;

pub use setup::check_privilege;
use setup::{ensure_tracefs, monotonic_ns, raise_memlock};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aya::maps::{Array, HashMap as BpfHashMap};
use aya::programs::{RawTracePoint, TracePoint};
use aya::{Ebpf, EbpfLoader};

use crate::sample::trace::{Counter, TraceSample};
use crate::sample::FileKey;
use layout::{FileCache, FileFaults, FileKeyC, PidFaults, PidFileIo, PidFileKeyC, PidReclaim};

/// Where tracefs is (or gets) mounted; aya looks there too.
pub const TRACEFS: &str = "/sys/kernel/tracing";

/// One tracepoint program of an object.
#[derive(Debug)]
struct Program {
    /// The C function name (aya's program name).
    func: &'static str,
    category: &'static str,
    event: &'static str,
    counter: Counter,
    /// Without it the counter means nothing (a begin without its end); optional ones
    /// (the readv/preadv variants of reads) only narrow what is counted.
    required: bool,
    /// A program for the same tracepoint attached raw (no formatted record: cheaper
    /// per event), tried first.
    raw: Option<&'static str>,
}

/// One compiled object: one program family of `ebpf/`.
#[derive(Debug)]
pub struct Family {
    pub name: &'static str,
    bytes: &'static [u8],
    programs: &'static [Program],
}

const fn p(
    func: &'static str,
    category: &'static str,
    event: &'static str,
    counter: Counter,
    required: bool,
) -> Program {
    Program {
        func,
        category,
        event,
        counter,
        required,
        raw: None,
    }
}

/// `prog`, with a raw-tracepoint variant `raw` tried first.
const fn p_raw(raw: &'static str, prog: Program) -> Program {
    Program {
        raw: Some(raw),
        ..prog
    }
}

use Counter as C;

/// The program families, in attach order.
#[rustfmt::skip]
pub static FAMILIES: [Family; 4] = [
    Family {
        name: "faults",
        bytes: aya::include_bytes_aligned!("../../../ebpf/faults.bpf.o"),
        programs: &[
            p_raw("page_fault_user_raw",
                p("page_fault_user", "exceptions", "page_fault_user", C::PageFaults, true)),
            p_raw("page_fault_kernel_raw",
                p("page_fault_kernel", "exceptions", "page_fault_kernel", C::PageFaults, false)),
            p("filemap_fault", "filemap", "mm_filemap_fault", C::FileFaults, true),
            p("filemap_map_pages", "filemap", "mm_filemap_map_pages", C::FaultAround, true),
        ],
    },
    Family {
        name: "pagecache",
        bytes: aya::include_bytes_aligned!("../../../ebpf/pagecache.bpf.o"),
        programs: &[
            p("add_to_page_cache", "filemap", "mm_filemap_add_to_page_cache", C::PageCacheAdds, true),
            p("delete_from_page_cache", "filemap", "mm_filemap_delete_from_page_cache", C::PageCacheEvictions, true),
        ],
    },
    Family {
        name: "reclaim",
        bytes: aya::include_bytes_aligned!("../../../ebpf/reclaim.bpf.o"),
        programs: &[
            p("direct_reclaim_begin", "vmscan", "mm_vmscan_direct_reclaim_begin", C::DirectReclaim, true),
            p("direct_reclaim_end", "vmscan", "mm_vmscan_direct_reclaim_end", C::DirectReclaim, true),
            p("memcg_reclaim_begin", "vmscan", "mm_vmscan_memcg_reclaim_begin", C::MemcgReclaim, true),
            p("memcg_reclaim_end", "vmscan", "mm_vmscan_memcg_reclaim_end", C::MemcgReclaim, true),
            p("mark_victim", "oom", "mark_victim", C::OomKills, true),
        ],
    },
    Family {
        name: "syscalls",
        bytes: aya::include_bytes_aligned!("../../../ebpf/syscalls.bpf.o"),
        programs: &[
            p("enter_read", "syscalls", "sys_enter_read", C::Reads, true),
            p("exit_read", "syscalls", "sys_exit_read", C::Reads, true),
            p("enter_pread64", "syscalls", "sys_enter_pread64", C::Reads, false),
            p("exit_pread64", "syscalls", "sys_exit_pread64", C::Reads, false),
            p("enter_readv", "syscalls", "sys_enter_readv", C::Reads, false),
            p("exit_readv", "syscalls", "sys_exit_readv", C::Reads, false),
            p("enter_preadv", "syscalls", "sys_enter_preadv", C::Reads, false),
            p("exit_preadv", "syscalls", "sys_exit_preadv", C::Reads, false),
            p("enter_mmap", "syscalls", "sys_enter_mmap", C::Mmaps, true),
            p("exit_mmap", "syscalls", "sys_exit_mmap", C::Mmaps, true),
        ],
    },
];

/// Why tracing cannot start at all.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("eBPF tracing needs root, or CAP_BPF and CAP_PERFMON ({what}); scan, residency and dupes work without it")]
    Privilege { what: String },
    #[error("tracefs is not mounted at '{path}' and mounting it failed: {source}")]
    Tracefs {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot load the BPF object '{object}'")]
    Load {
        object: String,
        #[source]
        source: Box<aya::EbpfError>,
    },
    #[error("BPF map '{map}' of '{object}' is missing or has another layout than twofold's")]
    Map {
        object: &'static str,
        map: &'static str,
        #[source]
        source: Option<aya::maps::MapError>,
    },
    #[error("no tracepoint could be attached: {0}")]
    NothingAttached(String),
}

impl TraceError {
    /// The kernel refused (EPERM/EACCES) somewhere down the chain.
    fn is_permission(e: &(dyn std::error::Error + 'static)) -> bool {
        let mut cur = Some(e);
        while let Some(err) = cur {
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                if matches!(io.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
                    return true;
                }
            }
            cur = err.source();
        }
        false
    }
}

/// What to trace with particular care: these processes and files get entries in the
/// non-LRU maps, so no amount of other activity can evict their counters.
#[derive(Debug, Clone, Default)]
pub struct TraceOptions {
    pub pids: Vec<i32>,
    pub files: Vec<FileKey>,
    /// Load `NAME.bpf.o` from this directory instead of the embedded objects (to test
    /// freshly built ones).
    pub objects_dir: Option<PathBuf>,
    /// Attach these `category:event` tracepoints under another event name (the tests
    /// name one that does not exist, to see a missing tracepoint disable only its
    /// counter).
    #[doc(hidden)]
    pub rename_events: Vec<(String, String)>,
}

/// Environment variable naming a directory of `NAME.bpf.o` objects to load instead of
/// the embedded ones (used by the tests of freshly built objects).
pub const OBJECTS_ENV: &str = "TWOFOLD_BPF_OBJECTS";

impl TraceOptions {
    /// Options pinning these processes and files, with the objects of [`OBJECTS_ENV`]
    /// when it is set.
    pub fn pinning(pids: &[i32], files: &[FileKey]) -> TraceOptions {
        TraceOptions {
            pids: pids.to_vec(),
            files: files.to_vec(),
            objects_dir: std::env::var_os(OBJECTS_ENV).map(PathBuf::from),
            ..TraceOptions::default()
        }
    }

    fn event_name<'a>(&'a self, prog: &'a Program) -> &'a str {
        let full = format!("{}:{}", prog.category, prog.event);
        self.rename_events
            .iter()
            .find(|(from, _)| *from == full)
            .map_or(prog.event, |(_, to)| to.as_str())
    }
}

/// A loaded object and its attached programs.
struct Loaded {
    family: &'static Family,
    ebpf: Ebpf,
}

/// Attached programs; detached when dropped.
pub struct Tracer {
    loaded: Vec<Loaded>,
    unavailable: BTreeMap<Counter, String>,
    warnings: Vec<crate::sample::Warning>,
    started: Instant,
    /// CLOCK_MONOTONIC at `started`, the clock of `bpf_ktime_get_ns`.
    started_ns: u64,
    attach_time: Duration,
}

impl Tracer {
    /// Loads every program family, fills the pinned maps for `opts` and attaches each
    /// program to its tracepoint.
    pub fn attach(opts: &TraceOptions) -> Result<Tracer, TraceError> {
        let t0 = Instant::now();
        check_privilege(Path::new("/proc"))?;
        raise_memlock();
        ensure_tracefs()?;
        let mut tracer = Tracer {
            loaded: Vec::new(),
            unavailable: BTreeMap::new(),
            warnings: Vec::new(),
            started: t0,
            started_ns: 0,
            attach_time: Duration::ZERO,
        };
        // One loader for all objects: creating one parses the kernel's BTF (a few MiB,
        // tens of milliseconds), which CO-RE relocations need.
        let mut loader = EbpfLoader::new();
        for family in &FAMILIES {
            let ebpf = match load(&mut loader, family, opts.objects_dir.as_deref()) {
                Ok(e) => e,
                Err(e) if TraceError::is_permission(&e) => {
                    return Err(TraceError::Privilege {
                        what: format!("the kernel refused to load '{}': {e:#}", family.name),
                    })
                }
                Err(e) => {
                    let why = format!("{:#}", anyhow::Error::from(e));
                    for p in family.programs {
                        tracer
                            .unavailable
                            .entry(p.counter)
                            .or_insert_with(|| why.clone());
                    }
                    continue;
                }
            };
            tracer.loaded.push(Loaded { family, ebpf });
        }
        tracer.pin_pids(&opts.pids)?;
        tracer.pin_files(&opts.files)?;
        let mut attached = 0;
        for l in &mut tracer.loaded {
            for prog in l.family.programs {
                let event = opts.event_name(prog);
                match attach_one(&mut l.ebpf, prog, event) {
                    Ok(()) => attached += 1,
                    Err(e) if TraceError::is_permission(e.as_ref()) => {
                        return Err(TraceError::Privilege {
                            what: format!(
                                "the kernel refused '{}:{event}': {}",
                                prog.category,
                                chain(e.as_ref())
                            ),
                        })
                    }
                    Err(e) => {
                        let why = format!(
                            "tracepoint '{}:{event}' not attached: {}",
                            prog.category,
                            chain(e.as_ref())
                        );
                        if prog.required {
                            tracer.unavailable.entry(prog.counter).or_insert(why);
                        } else {
                            tracer.warnings.push(crate::sample::Warning::new(
                                crate::sample::WarningKind::Trace,
                                format!("{}:{event}", prog.category),
                                why,
                            ));
                        }
                    }
                }
            }
        }
        if attached == 0 {
            let why: Vec<String> = tracer.unavailable.values().cloned().collect();
            return Err(TraceError::NothingAttached(why.join("; ")));
        }
        tracer.attach_time = t0.elapsed();
        tracer.started = Instant::now();
        tracer.started_ns = monotonic_ns();
        Ok(tracer)
    }

    /// How long loading and attaching took.
    pub fn attach_time(&self) -> Duration {
        self.attach_time
    }

    /// Counters that are unavailable, with the reason.
    pub fn unavailable(&self) -> &BTreeMap<Counter, String> {
        &self.unavailable
    }

    /// Non-fatal problems (optional tracepoints that could not be attached).
    pub fn warnings(&self) -> &[crate::sample::Warning] {
        &self.warnings
    }

    fn map_mut<'a>(
        l: &'a mut Loaded,
        name: &'static str,
    ) -> Result<&'a mut aya::maps::Map, TraceError> {
        let object = l.family.name;
        l.ebpf.map_mut(name).ok_or(TraceError::Map {
            object,
            map: name,
            source: None,
        })
    }

    /// Gives these processes entries in the non-LRU maps (kept through any churn).
    pub fn pin_pids(&mut self, pids: &[i32]) -> Result<(), TraceError> {
        if !pids.is_empty() {
            self.configure(layout::CONFIG_PINNED_PIDS, 1)?;
        }
        for l in &mut self.loaded {
            match l.family.name {
                "faults" => pin(l, "pid_faults_pinned", pids, PidFaults::default())?,
                "reclaim" => pin(l, "pid_reclaim_pinned", pids, PidReclaim::default())?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Makes these files "of interest": their counters live in non-LRU maps, and
    /// reads of them are counted per process in a non-LRU map too.
    pub fn pin_files(&mut self, files: &[FileKey]) -> Result<(), TraceError> {
        let keys: Vec<FileKeyC> = files.iter().map(|k| FileKeyC::new(*k)).collect();
        if !keys.is_empty() {
            self.configure(layout::CONFIG_PINNED_FILES, 1)?;
        }
        for l in &mut self.loaded {
            match l.family.name {
                "faults" => pin(l, "file_faults_pinned", &keys, FileFaults::default())?,
                "pagecache" => pin(l, "file_cache_pinned", &keys, FileCache::default())?,
                "syscalls" => pin(l, "interest", &keys, 1u8)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Sets `config[index]` in every object.
    fn configure(&mut self, index: u32, value: u64) -> Result<(), TraceError> {
        for l in &mut self.loaded {
            let object = l.family.name;
            let m = Tracer::map_mut(l, "config")?;
            let mut a: Array<_, u64> = Array::try_from(m).map_err(|e| TraceError::Map {
                object,
                map: "config",
                source: Some(e),
            })?;
            a.set(index, value, 0).map_err(|e| TraceError::Map {
                object,
                map: "config",
                source: Some(e),
            })?;
        }
        Ok(())
    }

    /// Deletes the counters of processes that exited (`pids`) and their entries in the
    /// read() ledger (`io`), so that the maps and the snapshots hold the living (a pid
    /// used again starts from zero). The caller keeps what per-file totals need.
    pub fn forget(&mut self, pids: &[i32], io: &[(i32, FileKey)]) {
        let pid_keys: Vec<u32> = pids.iter().map(|p| *p as u32).collect();
        let io_keys: Vec<PidFileKeyC> = io.iter().map(|(p, k)| PidFileKeyC::new(*p, *k)).collect();
        for l in &mut self.loaded {
            match l.family.name {
                "faults" => {
                    remove::<u32, PidFaults>(l, &["pid_faults_pinned", "pid_faults"], &pid_keys)
                }
                "reclaim" => {
                    remove::<u32, PidReclaim>(l, &["pid_reclaim_pinned", "pid_reclaim"], &pid_keys)
                }
                "syscalls" => remove::<PidFileKeyC, PidFileIo>(l, &["io_pinned", "io"], &io_keys),
                _ => {}
            }
        }
    }

    /// Reads every map now.
    pub fn sample(&self) -> TraceSample {
        let mut s = read::sample(self.loaded.iter().map(|l| (l.family.name, &l.ebpf)));
        s.at_secs = self.started.elapsed().as_secs_f64();
        s.attached_mono_ns = self.started_ns;
        s.unavailable = self.unavailable.clone();
        for k in &mut s.oom_kills {
            k.at_secs -= self.started_ns as f64 / 1e9;
        }
        s
    }
}

/// Deletes `keys` from the hash maps `maps` of `l` (a key not there is no error).
fn remove<K: aya::Pod, V: aya::Pod>(l: &mut Loaded, maps: &[&'static str], keys: &[K]) {
    if keys.is_empty() {
        return;
    }
    for map in maps {
        let Some(m) = l.ebpf.map_mut(map) else {
            continue;
        };
        let Ok(mut h) = BpfHashMap::<_, K, V>::try_from(m) else {
            continue;
        };
        for k in keys {
            let _ = h.remove(k);
        }
    }
}

/// Inserts `zero` for each key not yet present (BPF_NOEXIST keeps existing counters).
fn pin<K: aya::Pod, V: aya::Pod>(
    l: &mut Loaded,
    map: &'static str,
    keys: &[K],
    zero: V,
) -> Result<(), TraceError> {
    let object = l.family.name;
    let m = Tracer::map_mut(l, map)?;
    let mut h: BpfHashMap<_, K, V> = BpfHashMap::try_from(m).map_err(|e| TraceError::Map {
        object,
        map,
        source: Some(e),
    })?;
    for k in keys {
        const BPF_NOEXIST: u64 = 1;
        // EEXIST is the expected outcome for keys already there; a full map only means
        // that file falls back to the LRU map.
        let _ = h.insert(k, zero, BPF_NOEXIST);
    }
    Ok(())
}

fn load(
    loader: &mut EbpfLoader<'_>,
    family: &Family,
    dir: Option<&Path>,
) -> Result<Ebpf, TraceError> {
    let object = format!("{}.bpf.o", family.name);
    let result = match dir {
        Some(d) => loader.load_file(d.join(&object)),
        None => loader.load(family.bytes),
    };
    result.map_err(|source| TraceError::Load {
        object,
        source: Box::new(source),
    })
}

/// Attaches the raw variant if there is one and the kernel takes it, else the
/// tracepoint program.
/// An error and its sources, `: `-separated.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

fn attach_one(
    ebpf: &mut Ebpf,
    prog: &Program,
    event: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(raw) = prog.raw {
        if attach_raw(ebpf, raw, event).is_ok() {
            return Ok(());
        }
    }
    let tp: &mut TracePoint = ebpf
        .program_mut(prog.func)
        .ok_or_else(|| format!("program '{}' is not in the object", prog.func))?
        .try_into()?;
    tp.load()
        .map_err(|e| format!("the verifier rejected '{}': {e}", prog.func))?;
    tp.attach(prog.category, event)?;
    Ok(())
}

fn attach_raw(ebpf: &mut Ebpf, func: &str, event: &str) -> Result<(), Box<dyn std::error::Error>> {
    let tp: &mut RawTracePoint = ebpf
        .program_mut(func)
        .ok_or_else(|| format!("program '{func}' is not in the object"))?
        .try_into()?;
    tp.load()?;
    tp.attach(event)?;
    Ok(())
}

//! `twofold probe`: device capabilities, import tests on a file mapping, endpoint rates
//! and the placement verdict. Every import attempt and every set of arms runs in a child
//! process (see [`job`]); this module plans them and assembles the report.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use twofold_probes::backend::{ArmPlan, Fake};
use twofold_probes::job::{Job, JobResult};
use twofold_probes::mapping::MappingKind;
use twofold_probes::types::{
    Arm, ArmsReport, BackendCaps, BackendKind, Caps, ImportMethod, ImportOutcome, ImportStatus,
    Topology,
};
use twofold_probes::{checksum, cuda, mapping, vulkan};

pub mod job;

use crate::cleanup::Registry;
use crate::cli::{ProbeArgs, ProbeBackendArg, ProbeJob};
use crate::model::probe::{self as model, BackendReport, ImportReport, ProbeFile, ProbeReport};
use crate::render;
use job::Failure;

/// Page granularity of imports and of the working set.
const ALIGN: u64 = crate::sample::PAGE_BYTES;

fn caps(args: &ProbeArgs) -> Caps {
    let want = |b: ProbeBackendArg| args.backend == ProbeBackendArg::All || args.backend == b;
    Caps {
        vulkan: if want(ProbeBackendArg::Vulkan) {
            vulkan::caps()
        } else {
            BackendCaps::absent("not requested")
        },
        cuda: if want(ProbeBackendArg::Cuda) {
            cuda::caps(Path::new(cuda::SYSFS))
        } else {
            BackendCaps::absent("not requested")
        },
    }
}

/// A backend to probe: kind, device index, name, topology, import alignment.
struct ProbeDevice {
    kind: BackendKind,
    device: usize,
    name: String,
    topology: Topology,
    methods: Vec<ImportMethod>,
    fake: Option<Fake>,
}

fn probe_devices(args: &ProbeArgs, caps: &Caps) -> anyhow::Result<Vec<ProbeDevice>> {
    let mut out = Vec::new();
    if args.backend == ProbeBackendArg::Fake {
        // Tests configure the stand-in through the environment (JSON of `Fake`).
        let fake: Fake = match std::env::var("TWOFOLD_PROBE_FAKE") {
            Ok(json) => serde_json::from_str(&json).context("cannot parse TWOFOLD_PROBE_FAKE")?,
            Err(_) => Fake::default(),
        };
        out.push(ProbeDevice {
            kind: BackendKind::Fake,
            device: 0,
            name: "fake device".into(),
            topology: fake.topology,
            methods: vec![ImportMethod::Fake],
            fake: Some(fake),
        });
        return Ok(out);
    }
    if !caps.vulkan.devices.is_empty() {
        let i = args
            .vulkan_device
            .unwrap_or_else(|| vulkan::default_device(&caps.vulkan.devices));
        let d = caps
            .vulkan
            .devices
            .get(i)
            .with_context(|| format!("no Vulkan device with index '{i}'"))?;
        out.push(ProbeDevice {
            kind: BackendKind::Vulkan,
            device: i,
            name: d.name.clone(),
            topology: d.topology,
            methods: vec![ImportMethod::VulkanHostPointer],
            fake: None,
        });
    }
    if !caps.cuda.devices.is_empty() {
        let i = args.cuda_device;
        let d = caps
            .cuda
            .devices
            .iter()
            .find(|d| d.ordinal as usize == i)
            .with_context(|| format!("no CUDA device with ordinal '{i}'"))?;
        out.push(ProbeDevice {
            kind: BackendKind::Cuda,
            device: i,
            name: d.name.clone(),
            topology: d.topology,
            methods: vec![
                ImportMethod::CudaRegisterDefault,
                ImportMethod::CudaRegisterReadOnly,
            ],
            fake: None,
        });
    }
    Ok(out)
}

/// Writes `size` pseudo-random bytes to a new file in `dir`.
fn write_probe_file(path: &Path, size: u64) -> anyhow::Result<()> {
    // The probe maps the whole file and every arm reads it: it must fit on disk and in
    // memory.
    crate::input::ensure_room("--size", size, path, 1)?;
    let mut f = std::io::BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(path)
            .with_context(|| format!("cannot create '{}'", path.display()))?,
    );
    let mut s = 0x2545_f491_4f6c_dd1du64 ^ size;
    let mut block = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        for w in block.chunks_exact_mut(8) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            w.copy_from_slice(&s.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])
            .with_context(|| format!("cannot write '{}'", path.display()))?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(())
}

struct Runner<'a> {
    exe: PathBuf,
    timeout: Duration,
    /// Warm-up and timed rounds of a set of arms.
    rounds: u32,
    cleanup: &'a Registry,
}

impl Runner<'_> {
    fn import(
        &self,
        t: &ProbeDevice,
        file: &Path,
        bytes: u64,
        method: ImportMethod,
    ) -> ImportOutcome {
        self.import_as(t, file, bytes, method, MappingKind::SharedReadOnly)
    }

    fn import_as(
        &self,
        t: &ProbeDevice,
        file: &Path,
        bytes: u64,
        method: ImportMethod,
        mapping: MappingKind,
    ) -> ImportOutcome {
        let job = Job::Import {
            backend: t.kind,
            device: t.device,
            file: file.to_path_buf(),
            bytes,
            method,
            mapping,
            fake: t.fake.clone(),
        };
        let failed = |status, error: String| ImportOutcome {
            method,
            mapping: mapping.name().into(),
            bytes,
            status,
            error: Some(error),
            seconds: 0.0,
            anon_bytes_delta: None,
            file_bytes_delta: None,
        };
        match job::spawn(&self.exe, &job, self.timeout, self.cleanup) {
            Ok(Ok(JobResult::Import(o))) => o,
            Ok(Ok(JobResult::Error(e))) => failed(ImportStatus::Failed, e),
            Ok(Ok(other)) => failed(
                ImportStatus::Crashed,
                format!("unexpected answer {other:?}"),
            ),
            Ok(Err(f @ Failure::Hang(_))) => failed(ImportStatus::Hang, f.to_string()),
            Ok(Err(f)) => failed(ImportStatus::Crashed, f.to_string()),
            Err(e) => failed(ImportStatus::Crashed, format!("{e:#}")),
        }
    }

    fn arms(
        &self,
        t: &ProbeDevice,
        file: &Path,
        bytes: u64,
        plan: ArmPlan,
    ) -> Result<ArmsReport, String> {
        let job = Job::Arms {
            backend: t.kind,
            device: t.device,
            file: file.to_path_buf(),
            bytes,
            plan,
            fake: t.fake.clone(),
        };
        // One timeout for the setup and one for every round of passes.
        let rounds = self.rounds + 1;
        match job::spawn(&self.exe, &job, self.timeout * rounds, self.cleanup) {
            Ok(Ok(JobResult::Arms(r))) => Ok(r),
            Ok(Ok(JobResult::Error(e))) => Err(e),
            Ok(Ok(other)) => Err(format!("unexpected answer {other:?}")),
            Ok(Err(f)) => Err(f.to_string()),
            Err(e) => Err(format!("{e:#}")),
        }
    }
}

/// Import tests at the working set, the ceiling search, and the import limit the arms
/// should respect.
fn imports(
    args: &ProbeArgs,
    r: &Runner<'_>,
    t: &ProbeDevice,
    file: &ProbeFile,
) -> (Vec<ImportReport>, Option<u64>) {
    let path = Path::new(&file.path);
    let w = file.working_set_bytes;
    let whole = mapping::align_down(file.size_bytes, ALIGN);
    let mut out = Vec::new();
    let mut limit: Option<u64> = None;
    for &m in &t.methods {
        let outcome = r.import(t, path, w, m);
        let ceiling = match outcome.status {
            ImportStatus::Ok if whole > w && args.ceiling_steps > 0 => {
                // The working set imports: see whether the whole file does too.
                Some(model::bisect(whole, ALIGN, 0, |s| {
                    r.import(t, path, s, m).status
                }))
            }
            ImportStatus::Failed | ImportStatus::Crashed if args.ceiling_steps > 0 => {
                let c = model::bisect(w, ALIGN, args.ceiling_steps, |s| {
                    if s == w {
                        outcome.status
                    } else {
                        r.import(t, path, s, m).status
                    }
                });
                if m != ImportMethod::CudaRegisterDefault {
                    if let Some(ok) = c.largest_ok {
                        limit = Some(limit.map_or(ok, |l: u64| l.max(ok)));
                    }
                }
                Some(c)
            }
            _ => None,
        };
        out.push(ImportReport { outcome, ceiling });
    }
    // Where the read-only shared mapping does not import (NVIDIA's Vulkan driver pins
    // pages for writing), say whether a writable view would, and at what cost. The
    // shared writable view dirties the file's pages, so only the generated file gets it.
    let vulkan_failed = out.iter().any(|i| {
        i.outcome.method == ImportMethod::VulkanHostPointer
            && i.outcome.status == ImportStatus::Failed
    });
    if vulkan_failed {
        let mut kinds = vec![MappingKind::PrivateCopyOnWrite];
        if file.generated {
            kinds.insert(0, MappingKind::SharedReadWrite);
        }
        for k in kinds {
            let outcome = r.import_as(t, path, w, ImportMethod::VulkanHostPointer, k);
            out.push(ImportReport {
                outcome,
                ceiling: None,
            });
        }
    }
    // An import that works at the working set needs no limit.
    if out.iter().any(|i| {
        i.outcome.status == ImportStatus::Ok
            && i.outcome.method != ImportMethod::CudaRegisterDefault
    }) {
        limit = None;
    }
    (out, limit)
}

fn probe_backend(
    args: &ProbeArgs,
    r: &Runner<'_>,
    t: &ProbeDevice,
    file: &ProbeFile,
    expected: twofold_probes::types::Checksum,
) -> BackendReport {
    let (import_reports, import_limit) = if args.no_import {
        (Vec::new(), None)
    } else {
        imports(args, r, t, file)
    };
    let mut processes = Vec::new();
    let mut process_errors = Vec::new();
    for p in 0..args.processes as usize {
        let mut order = Arm::ALL.to_vec();
        order.rotate_left(p % Arm::ALL.len());
        let plan = ArmPlan {
            order,
            warmup: args.warmup,
            passes: args.passes,
            expected,
            range_limit: args.range_limit,
            import_limit,
            chunk_bytes: args.chunk,
            references: p == 0,
        };
        match r.arms(t, Path::new(&file.path), file.working_set_bytes, plan) {
            Ok(rep) => processes.push(rep),
            Err(e) => process_errors.push(format!("process {p}: {e}")),
        }
    }
    let a = model::assess(file, t.topology, &processes, args.tie_band);
    BackendReport {
        backend: t.kind,
        device: t.name.clone(),
        topology: t.topology,
        imports: import_reports,
        processes,
        process_errors,
        endpoints: a.endpoints,
        limits: a.limits,
        capacity: a.capacity,
        resident_fraction: a.resident_fraction,
        verdict: a.verdict,
    }
}

fn mem_available() -> Option<u64> {
    crate::collect::system::read(&crate::collect::Roots::live().proc)
        .ok()?
        .meminfo
        .get("MemAvailable")
        .copied()
}

pub fn run(args: &ProbeArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    if let Some(ProbeJob::Job { json }) = &args.job {
        return job::child(json, out);
    }
    if let Some(path) = &args.report {
        let text = crate::input::read_bounded(path, "--report", crate::input::MAX_JSON_BYTES)?;
        let doc: ProbeReport = serde_json::from_slice(&text)
            .with_context(|| format!("'{}' is not a probe report", path.display()))?;
        return print(&doc, args.output.json, out);
    }
    if !args.caps {
        // Inputs are checked before any backend starts.
        match &args.file {
            Some(p) => {
                crate::input::check_regular(p, "file")?;
            }
            None => {
                let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
                crate::input::ensure_room("--size", args.size, &dir.join("probe.bin"), 1)?;
            }
        }
    }
    let caps = caps(args);
    if args.caps {
        let doc = ProbeReport {
            schema_version: crate::model::SCHEMA_VERSION,
            caps,
            file: None,
            backends: Vec::new(),
        };
        return print(&doc, args.output.json, out);
    }
    let devices = probe_devices(args, &caps)?;
    if devices.is_empty() {
        bail!(
            "no GPU backend is available (Vulkan: {}; CUDA: {})",
            caps.vulkan.not_available.as_deref().unwrap_or("no device"),
            caps.cuda.not_available.as_deref().unwrap_or("no device")
        );
    }
    let cleanup = Registry::install()?;
    let mut _tmp = None;
    let (path, generated) = match &args.file {
        Some(p) => (p.clone(), false),
        None => {
            let dir = cleanup
                .temp_dir("probe", args.dir.as_deref())
                .context("cannot create a directory for the probe file")?;
            let p = dir.path().join("probe.bin");
            write_probe_file(&p, args.size)?;
            _tmp = Some(dir);
            (p, true)
        }
    };
    let size = crate::input::check_regular(&path, "file")?;
    let w = mapping::align_down(args.working_set.unwrap_or(size).min(size), ALIGN);
    if w == 0 {
        bail!(
            "the working set of '{}' is smaller than one page ({ALIGN} bytes)",
            path.display()
        );
    }
    // The residency the verdict is about: before our own checksum pass reads the file.
    let at_start = job::resident_fraction(&path, w);
    // Reading it once for the checksum also brings it into the page cache.
    let map = mapping::map_shared_read_only(&path, w)
        .with_context(|| format!("cannot map '{}'", path.display()))?;
    let expected = checksum::parallel(&map);
    drop(map);
    let file = ProbeFile {
        path: path.display().to_string(),
        size_bytes: size,
        working_set_bytes: w,
        generated,
        resident_fraction_at_start: at_start,
        resident_fraction_after: job::resident_fraction(&path, w),
        cpu_checksum: expected.to_string(),
        mem_available_bytes: mem_available(),
    };
    let runner = Runner {
        exe: std::env::current_exe().context("cannot find the twofold executable")?,
        timeout: Duration::from_secs(args.timeout.max(1)),
        rounds: args.warmup + args.passes,
        cleanup: &cleanup,
    };
    let backends = devices
        .iter()
        .map(|t| probe_backend(args, &runner, t, &file, expected))
        .collect();
    let doc = ProbeReport {
        schema_version: crate::model::SCHEMA_VERSION,
        caps,
        file: Some(file),
        backends,
    };
    print(&doc, args.output.json, out)
}

fn print(doc: &ProbeReport, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    if json {
        render::json(out, doc)?;
    } else if doc.file.is_none() {
        out.write_all(crate::render::safe::terminal(&render::probe::caps(&doc.caps)).as_bytes())?;
    } else {
        out.write_all(crate::render::safe::terminal(&render::probe::human(doc)).as_bytes())?;
    }
    Ok(())
}

//! Device copies: GPU memory per process (NVML) turned into suspected device copies of the
//! model files a process held, mapped or read, and the proven device copies twofold's own
//! loaders made. Pure.
//!
//! NVML says how much device memory a process holds, never what is in it, so a foreign
//! process's device copy is only *suspected*: it held, mapped, read (the read() ledger) or
//! named the file, and holds at least [`super::SUSPECT_FRACTION`] of the file's size on one
//! GPU. Like a suspected private copy it is shown beside the count, never in it. A device
//! copy is proven only when a twofold loader made it and read it back identical.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{FileModel, SUSPECT_FRACTION};
use crate::sample::{CandidateWhy, GpuDeviceSample, GpuInfo, GpuProcessKind, Sample};

/// One GPU, as the report shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuModel {
    #[serde(flatten)]
    pub info: GpuInfo,
    /// Device memory of the processes NVML lists on it (summed); `None` if unknown.
    pub process_memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes_unavailable: Option<String>,
}

/// The GPUs of the host, or why they are not known.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpusModel {
    /// Why there is no GPU information (no NVIDIA driver, NVML failed); then every GPU
    /// value in the report is unknown (`null`), not 0.
    pub not_available: Option<String>,
    pub devices: Vec<GpuModel>,
    /// Uploads traced (`--trace` with a CUDA driver library); `None`: not traced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uploads: Option<UploadTraceModel>,
}

/// One process's memory on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuUse {
    pub gpu: u32,
    pub kind: GpuProcessKind,
    pub bytes: Option<u64>,
}

/// A device copy of a file: proven (a twofold loader checked it byte for byte) or suspected
/// (by size, from NVML).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceCopy {
    pub pid: i32,
    pub comm: String,
    /// NVML index of the GPU; `None` for a proof whose GPU NVML does not list.
    pub gpu: Option<u32>,
    pub gpu_name: Option<String>,
    /// The GPU shares host DRAM (`None`: not known).
    pub integrated: Option<bool>,
    /// Device memory of the process on that GPU (NVML), or that the loader allocated.
    pub device_bytes: u64,
    /// Device bytes attributed to this file (at most its size).
    pub attributed_bytes: u64,
    /// `attributed_bytes / size`.
    pub fraction: f64,
    pub proven: bool,
    /// How the process came to the file: `mapped`, `open`, `read`, `copied`, `named`,
    /// `loader` (a twofold loader's attestation), `upload` (its traced uploads matched),
    /// `clone` (cloned on the device from an upload of it).
    pub via: String,
    /// Wall clock (Unix ns) of the last matched upload or clone (`via: upload`, `clone`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proven_at_unix_ns: Option<u64>,
    /// What else is known (`tracing started after its load`, `cloned on the device`,
    /// `converted F32→BF16`, `matched by content; also identical to B`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Bytes of a model file a process uploaded (traced), and what that proves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UploadModel {
    pub pid: i32,
    pub comm: String,
    /// The GPU it holds device memory on (NVML), when it is one.
    pub gpu: Option<u32>,
    pub widened: bool,
    /// The dtype conversion the device holds (`None`: the file's bytes as they are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversion: Option<crate::sample::converted::Conversion>,
    /// Copied on the device from device memory that held these bytes (`cuMemcpyDtoD*`,
    /// `cuMemcpyPeer*`): a clone, not an upload.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cloned: bool,
    /// Why it is this file's when its bytes are other files' too (`the file it read`,
    /// `matched by content; also identical to B`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attribution: Option<String>,
    /// `[start, end)` byte ranges of the file.
    pub ranges: Vec<(u64, u64)>,
    pub file_bytes: u64,
    /// Device bytes these file bytes take (as the conversion makes them).
    pub device_bytes: u64,
    pub copies: u64,
    pub first_unix_ns: u64,
    pub last_unix_ns: u64,
    pub entry: String,
    /// Counted as a proven device copy.
    pub proven: bool,
    /// Why not, when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_proven: Option<String>,
}

/// A process registered its mapping of the file for device access: read in place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InPlaceModel {
    pub pid: i32,
    pub comm: String,
    pub file_offset: u64,
    pub bytes: u64,
    pub at_unix_ns: u64,
}

/// A process on a GPU whose uploads are traced, with what they were.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TracedProcessModel {
    #[serde(flatten)]
    pub seen: crate::sample::uploads::UploadProcess,
    /// Its device memory (NVML, all GPUs); `None`: unknown.
    pub gpu_memory_bytes: Option<u64>,
    /// `model bytes`, `not model bytes` (traced from its start, no model bytes
    /// uploaded) or `traced after its load`.
    pub verdict: String,
}

/// The upload tracer's view, when uploads were traced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UploadTraceModel {
    pub since_unix_ns: u64,
    /// The resident tracer whose ledger this is (`uploads traced by pid N since HH:MM`);
    /// `None`: this process traced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracer: Option<crate::sample::uploads::ResidentTracer>,
    /// GPUDirect Storage: the libcufile files traced, or why none is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gds: Option<crate::sample::uploads::GdsTrace>,
    pub libraries: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    pub lost_events: u64,
    pub processes: Vec<TracedProcessModel>,
}

/// `HH:MM:SS` (UTC) of a Unix time in nanoseconds.
pub fn clock(unix_ns: u64) -> String {
    let s = unix_ns / 1_000_000_000;
    format!("{:02}:{:02}:{:02} UTC", s / 3600 % 24, s / 60 % 60, s % 60)
}

fn gpu_model(d: &GpuDeviceSample) -> GpuModel {
    let process_memory_bytes = match &d.processes_unavailable {
        Some(_) => None,
        None => d
            .processes
            .iter()
            .map(|p| p.used_bytes)
            .try_fold(0u64, |a, b| Some(a + b?)),
    };
    GpuModel {
        info: d.info.clone(),
        process_memory_bytes,
        processes_unavailable: d.processes_unavailable.clone(),
    }
}

/// The GPUs of a sample.
pub fn gpus(sample: &Sample) -> GpusModel {
    GpusModel {
        not_available: sample.gpu.not_available.clone(),
        devices: sample.gpu.devices.iter().map(gpu_model).collect(),
        uploads: sample.gpu.uploads.as_ref().map(|u| UploadTraceModel {
            since_unix_ns: u.since_unix_ns,
            tracer: u.tracer.clone(),
            gds: u.gds.clone(),
            libraries: u.libraries.iter().map(|l| l.path.clone()).collect(),
            unavailable: u.unavailable.clone(),
            lost_events: u.lost_events,
            processes: u
                .processes
                .iter()
                .filter(|p| alive(sample, p.pid))
                .map(|p| {
                    let gpu_memory_bytes = gpu_memory(sample, p.pid);
                    TracedProcessModel {
                        verdict: verdict(p).into(),
                        seen: p.clone(),
                        gpu_memory_bytes,
                    }
                })
                .collect(),
        }),
    }
}

pub(super) fn alive(sample: &Sample, pid: i32) -> bool {
    sample.processes.iter().any(|p| p.pid == pid)
}

/// Device memory of `pid` on every GPU together; `None` when NVML is not available.
fn gpu_memory(sample: &Sample, pid: i32) -> Option<u64> {
    process_uses(sample, pid).map(|u| u.iter().filter_map(|g| g.bytes).sum())
}

fn verdict(p: &crate::sample::uploads::UploadProcess) -> &'static str {
    if p.model_bytes > 0 {
        "model bytes"
    } else if p.traced_from_start {
        "not model bytes"
    } else {
        "traced after its load"
    }
}

/// The one GPU `pid` holds memory on, if one.
pub(super) fn only_gpu(sample: &Sample, pid: i32) -> Option<u32> {
    only_gpu_in(&sample.gpu, pid)
}

/// The one GPU `pid` holds memory on in `gpu`, if one (the GPU an upload is put on).
pub fn only_gpu_in(gpu: &crate::sample::GpuSample, pid: i32) -> Option<u32> {
    let gpus: std::collections::BTreeSet<u32> = gpu
        .devices
        .iter()
        .filter(|d| {
            d.processes
                .iter()
                .any(|p| p.pid == pid && p.used_bytes.unwrap_or(0) > 0)
        })
        .map(|d| d.info.index)
        .collect();
    (gpus.len() == 1).then(|| *gpus.iter().next().unwrap_or(&0))
}

/// The device memory of `pid` on every GPU; `None` when NVML is not available or a GPU's
/// process list could not be read.
pub fn process_uses(sample: &Sample, pid: i32) -> Option<Vec<GpuUse>> {
    if sample.gpu.not_available.is_some()
        || sample
            .gpu
            .devices
            .iter()
            .any(|d| d.processes_unavailable.is_some())
    {
        return None;
    }
    Some(
        sample
            .gpu
            .devices
            .iter()
            .flat_map(|d| {
                d.processes
                    .iter()
                    .filter(move |p| p.pid == pid)
                    .map(|p| GpuUse {
                        gpu: d.info.index,
                        kind: p.kind,
                        bytes: p.used_bytes,
                    })
            })
            .collect(),
    )
}

pub(super) fn fraction(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// How `pid` came to the file, if it did.
fn via(
    sample: &Sample,
    reads: &BTreeMap<(i32, crate::sample::FileKey), u64>,
    f: &FileModel,
    pid: i32,
) -> Option<&'static str> {
    let size = f.size_bytes.unwrap_or(0);
    if f.mappers.iter().any(|m| m.pid == pid) {
        Some("mapped")
    } else if f.holders.iter().any(|h| h.pid == pid) {
        Some("open")
    } else if f.proven_copies.iter().any(|c| c.pid == pid) {
        Some("copied")
    } else if reads
        .get(&(pid, f.key))
        .is_some_and(|b| *b as f64 >= SUSPECT_FRACTION * size as f64)
    {
        Some("read")
    } else if sample.named.contains(&(pid, f.key))
        || sample
            .candidates
            .iter()
            .any(|c| c.pid == pid && c.file == f.key && c.why == CandidateWhy::Named)
    {
        Some("named")
    } else {
        None
    }
}

/// Fills each file's device copies (proven, then suspected from what is left of each
/// process's device memory, largest file first) and the device part of its count; `reads`
/// is the read() ledger (what [`super::relation`] and the suspicions go by).
pub fn attribute(
    sample: &Sample,
    reads: &BTreeMap<(i32, crate::sample::FileKey), u64>,
    files: &mut [FileModel],
) {
    let known = sample.gpu.not_available.is_none();
    let relations = super::relation::Relations::new(sample, reads, files);
    let comm = |pid: i32| {
        sample
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .map(|p| p.comm.clone())
            .unwrap_or_default()
    };
    // Device memory per (pid, gpu) left to attribute.
    let mut left: BTreeMap<(i32, u32), u64> = BTreeMap::new();
    for d in &sample.gpu.devices {
        for p in &d.processes {
            *left.entry((p.pid, d.info.index)).or_default() += p.used_bytes.unwrap_or(0);
        }
    }
    let gpu_of = |uuid: Option<&str>| {
        sample
            .gpu
            .devices
            .iter()
            .find(|d| uuid.is_some() && d.info.uuid.as_deref() == uuid)
    };
    let mut order: Vec<usize> = (0..files.len()).collect();
    order.sort_by(|a, b| files[*b].size_bytes.cmp(&files[*a].size_bytes));
    for i in order {
        let f = &mut files[i];
        let size = f.size_bytes.unwrap_or(0);
        for pr in sample.gpu.device_proofs.iter().filter(|p| p.file == f.key) {
            let g = gpu_of(pr.gpu_uuid.as_deref());
            if let Some(g) = g {
                if let Some(l) = left.get_mut(&(pr.pid, g.info.index)) {
                    *l = l.saturating_sub(pr.device_bytes);
                }
            }
            f.device_copies.push(DeviceCopy {
                pid: pr.pid,
                comm: comm(pr.pid),
                gpu: g.map(|g| g.info.index),
                gpu_name: g.and_then(|g| g.info.name.clone()),
                integrated: g.and_then(|g| g.info.integrated),
                device_bytes: pr.device_bytes,
                attributed_bytes: pr.file_bytes.min(size),
                fraction: fraction(pr.file_bytes.min(size), size),
                proven: true,
                via: "loader".into(),
                proven_at_unix_ns: None,
                note: None,
            });
        }
        super::device_uploads::uploads_of(sample, &relations, f, &mut left);
        // Whoever uploaded bytes of it (counted here or under a file of the same bytes).
        let uploaders: std::collections::BTreeSet<i32> = sample
            .gpu
            .uploads
            .iter()
            .flat_map(|u| u.uploads.iter())
            .filter(|u| u.file == f.key)
            .map(|u| u.pid)
            .collect();
        let indexed = sample
            .gpu
            .uploads
            .as_ref()
            .is_some_and(|u| u.indexed.is_empty() || u.indexed.contains(&f.key));
        if size > 0 {
            for d in &sample.gpu.devices {
                let pids: std::collections::BTreeSet<i32> =
                    d.processes.iter().map(|p| p.pid).collect();
                for pid in pids {
                    let Some(avail) = left.get_mut(&(pid, d.info.index)) else {
                        continue;
                    };
                    if (*avail as f64) < SUSPECT_FRACTION * size as f64 {
                        continue;
                    }
                    let Some(how) = via(sample, reads, f, pid) else {
                        continue;
                    };
                    let traced = traced_process(sample, pid);
                    if uploaders.contains(&pid)
                        || (indexed && traced.is_some_and(|p| p.traced_from_start))
                    {
                        // Its uploads are known: what it uploaded of the file is above,
                        // and nothing else of its device memory is this file's.
                        continue;
                    }
                    let attributed = (*avail).min(size);
                    let device_bytes = *avail;
                    *avail -= attributed;
                    f.device_copies.push(DeviceCopy {
                        pid,
                        comm: comm(pid),
                        gpu: Some(d.info.index),
                        gpu_name: d.info.name.clone(),
                        integrated: d.info.integrated,
                        device_bytes,
                        attributed_bytes: attributed,
                        fraction: fraction(attributed, size),
                        proven: false,
                        via: how.into(),
                        proven_at_unix_ns: None,
                        note: traced.map(|p| {
                            format!(
                                "upload tracing started after its load ({})",
                                clock(p.traced_since_unix_ns)
                            )
                        }),
                    });
                }
            }
        }
        f.device_copies.sort_by_key(|a| (!a.proven, a.pid, a.gpu));
        let proven = f
            .device_copies
            .iter()
            .filter(|c| c.proven)
            .fold(0.0, |a, c| a + c.fraction);
        f.representations.device = (known || proven > 0.0).then_some(proven);
        f.representations.suspected_device = f
            .device_copies
            .iter()
            .filter(|c| !c.proven)
            .fold(0.0, |a, c| a + c.fraction);
    }
}

/// What the upload tracer saw of `pid`, if anything.
fn traced_process(sample: &Sample, pid: i32) -> Option<&crate::sample::uploads::UploadProcess> {
    sample
        .gpu
        .uploads
        .as_ref()
        .and_then(|u| u.processes.iter().find(|p| p.pid == pid))
}

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
    /// How the process came to the file: `mapped`, `open`, `read`, `copied`, `named`, `loader`.
    pub via: String,
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
    }
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

fn fraction(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// How `pid` came to the file, if it did.
fn via(sample: &Sample, f: &FileModel, pid: i32) -> Option<&'static str> {
    let size = f.size_bytes.unwrap_or(0);
    if f.mappers.iter().any(|m| m.pid == pid) {
        Some("mapped")
    } else if f.holders.iter().any(|h| h.pid == pid) {
        Some("open")
    } else if f.proven_copies.iter().any(|c| c.pid == pid) {
        Some("copied")
    } else if sample.reads.iter().any(|r| {
        r.pid == pid && r.file == f.key && r.read_bytes as f64 >= SUSPECT_FRACTION * size as f64
    }) {
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
/// process's device memory, largest file first) and the device part of its count.
pub fn attribute(sample: &Sample, files: &mut [FileModel]) {
    let known = sample.gpu.not_available.is_none();
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
            });
        }
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
                    let Some(how) = via(sample, f, pid) else {
                        continue;
                    };
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

//! GPU series: the GPUs NVML lists, device memory per workload, and device copies of model
//! files. Nothing is exported for what is not known (no NVIDIA GPU): `twofold_gpus_known`
//! says which it is, so a dashboard can tell "no device copy" from "not known".

use super::{l, Acc, Options};
use crate::model::{FileModel, Report};

/// Per GPU and per workload on it.
pub(super) fn series(acc: &mut Acc, r: &Report, opts: Options) {
    let known = r.gpus.not_available.is_none();
    acc.gauge(
        "twofold_gpus_known",
        "1 when NVML answered (GPU series below are complete), 0 when GPU memory is not known here",
        Vec::new(),
        if known { 1.0 } else { 0.0 },
    );
    for d in &r.gpus.devices {
        let gpu = d.info.index.to_string();
        let kind = match d.info.integrated {
            Some(true) => "integrated",
            Some(false) => "discrete",
            None => "unknown",
        };
        acc.gauge(
            "twofold_gpu_info",
            "A GPU NVML lists: name, UUID and whether it shares host memory (integrated) or not (discrete)",
            l(&[
                ("gpu", &gpu),
                ("name", d.info.name.as_deref().unwrap_or("")),
                ("uuid", d.info.uuid.as_deref().unwrap_or("")),
                ("type", kind),
            ]),
            1.0,
        );
        for (name, help, v) in [
            (
                "twofold_gpu_memory_total_bytes",
                "Device memory of the GPU",
                d.info.memory_total_bytes,
            ),
            (
                "twofold_gpu_memory_used_bytes",
                "Device memory in use on the GPU (all processes and the driver)",
                d.info.memory_used_bytes,
            ),
        ] {
            if let Some(v) = v {
                acc.gauge(name, help, l(&[("gpu", &gpu)]), v as f64);
            }
        }
    }
    for p in &r.processes {
        for u in &p.gpu_memory {
            let Some(b) = u.bytes else { continue };
            let gpu = u.gpu.to_string();
            let mut labels = l(&[("gpu", &gpu), ("workload", &p.comm)]);
            if opts.per_pid {
                labels.push(("pid".into(), p.pid.to_string()));
            }
            acc.gauge(
                "twofold_gpu_process_memory_bytes",
                "Device memory held by the processes of a workload (comm) on a GPU (NVML)",
                labels,
                b as f64,
            );
        }
    }
}

/// Device copies of one file: suspected bytes (the proven ones are `kind="device"` of
/// `twofold_file_held_bytes`).
pub(super) fn file_series(acc: &mut Acc, f: &FileModel, id: &str, known: bool) {
    // Traced uploads (serve --trace): device bytes written from the file, per GPU (the
    // GPU where NVML shows the process, `unknown` without NVML or with several).
    // Processes that exited keep their bytes here (per the GPU they were last seen on), so
    // the counter never goes down.
    let living = f
        .uploads
        .iter()
        .filter(|u| !u.cloned)
        .map(|u| (u.gpu, u.device_bytes));
    let exited = f.uploads_retired.iter().map(|r| (r.gpu, r.device_bytes));
    for (gpu, bytes) in living.chain(exited) {
        let gpu = gpu.map_or("unknown".to_string(), |g| g.to_string());
        acc.add(
            "twofold_file_device_uploaded_bytes",
            "Device bytes processes uploaded from the file since tracing started, theirs kept when they exit (uprobes on the CUDA driver, matched by content)",
            super::Kind::Counter,
            l(&[("file_id", id), ("gpu", &gpu)]),
            bytes as f64,
        );
    }
    if !known {
        return;
    }
    let suspected: u64 = f
        .device_copies
        .iter()
        .filter(|d| !d.proven)
        .map(|d| d.attributed_bytes)
        .sum();
    acc.gauge(
        "twofold_file_device_copy_suspected_bytes",
        "Device memory of processes that held, mapped or read the file, attributed to it (NVML sizes, not contents): beside the count, never in it",
        l(&[("file_id", id)]),
        suspected as f64,
    );
}
